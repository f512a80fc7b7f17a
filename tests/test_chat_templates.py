"""Token-in-token-out rendering under templates with the structure of real checkpoints' ones.

`tests/data/chat_templates/` holds test templates written here with the structure of Qwen3.5's
(multimodal content, think blocks after the last user query, grouped tool responses, XML calls)
and Qwen3's (JSON calls, a think block on earlier turns only around non-empty reasoning). Under
each, the agent loop (a ScriptedEngine policy in a scripted shop) must hand the engine, turn after
turn, exactly `apply_chat_template` of the conversation so far with its generation prompt; where
that cannot hold, `check_template` must refuse at load and name the property. `BEHAVIOURS` lists
what the two test templates reproduce of the official ones, each with a case that fails when a
template edit drops it. The first official template, SmolLM2's, is fetched at test time and goes
through the same incremental and refusal tests.
"""

import copy
import dataclasses
import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import pytest

from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec, run_episodes
from intraskill_jax.agent.prompts import system_prompt
from intraskill_jax.rollout.base import SamplingParams, ScriptedEngine
from intraskill_jax.tokenization import (
    IM_END,
    ChatTemplateError,
    ToolCall,
    chat_template,
    check_template,
    continuation_text,
    format_tool_calls,
    prompt_ids,
    to_env_action,
    tools_for,
    train_tokenizer,
)

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
VISION_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
CORPUS = [
    "Page 1 [SEP] B0001 [SEP] Blue latex pillow, 40x60cm. Shopper: 40x60, please. Buy Now",
    '{"name": "click", "arguments": {"value": "buy now"}} <function=search> <parameter=keywords>',
    "I should search first. Open it and ask the shopper which size. Thank you for shopping.",
] * 20


FORMAT = {"qwen3_5": "xml", "qwen3": "json"}  # each family's tool-call format (models/families.py)


def tokenizer_with(template: str, family: str):
    """A tokenizer built here (Qwen special tokens plus the vision ones) carrying `template`:
    'qwen3_5' / 'qwen3' are the test templates of the real checkpoints' structure, 'project' the
    project's own template of `family`."""
    tok = train_tokenizer(CORPUS, vocab_size=500, tool_format=FORMAT[family])
    tok.add_tokens(VISION_TOKENS, special_tokens=True)
    tok.chat_template = chat_template(FORMAT[family]) if template == "project" else (TEMPLATES / f"{template}.jinja").read_text()
    return tok


# -- a scripted shop: every page known, so the conversation can be written out by hand -----------

FIRST_PAGE = "Find a blue latex pillow, 40x60cm, under 30 dollars. [SEP] Search"
PAGES = {
    # A trailing newline: Qwen3.5's template trims tool responses, Qwen3's keeps them as they are.
    "search[blue latex pillow]": "Page 1 [SEP] B0001 [SEP] Blue latex pillow, 40x60cm\n",
    "click[B0001]": "Blue latex pillow [SEP] size: 40x60 [SEP] Buy Now",
    "ask[Which size?]": "Shopper: 40x60, please.",
    "click[buy now]": "Thank you for shopping.",
}
# (reasoning, content, calls): the second turn makes two calls, whose responses share a user turn.
TURNS = [
    ("I should search first.", "", [ToolCall("search", {"keywords": "blue latex pillow"})]),
    ("Open it and ask the shopper.", "Two steps at once.",
     [ToolCall("click", {"value": "B0001"}), ToolCall("ask_shopper", {"question": "Which size?"})]),
    ("It fits.", "", [ToolCall("click", {"value": "buy now"})]),
]


@dataclasses.dataclass
class Page:
    observation: str
    done: bool = False
    info: dict = dataclasses.field(default_factory=dict)


class ScriptedShop:
    """The `Env` protocol over `PAGES`: buying ends the episode with full reward."""

    lang = "en"
    config = types.SimpleNamespace(mode="multi", reward="strict")

    def __init__(self):
        self.done, self.stats = False, types.SimpleNamespace()

    def reset(self, task_id):
        return Page(FIRST_PAGE, info={"view": {}})

    def step(self, action):
        self.done = action == "click[buy now]"
        info = {"reward_detail": {"strict": 1.0, "loose": 1.0, "success": 1.0}, "stats": {}} if self.done else {}
        return Page(PAGES[action], self.done, info)


def play(tok, family, thinking, separator):
    """One episode of TURNS through `run_episodes`; returns the trajectory and each engine input.

    The scripted policy continues its prompt as a model would: it closes a think block its
    generation prompt opened (or writes the whole block when the prompt opened none), and joins
    content and calls with `separator`, the template's own.
    """
    seen = []

    def script(session, ids):
        reasoning, content, calls = TURNS[len(seen)]
        seen.append(list(ids))
        reply = ""
        if thinking:
            opened = tok.decode(ids, skip_special_tokens=False).endswith("<think>\n")
            reply = ("" if opened else "<think>\n") + reasoning + "\n</think>\n\n"
        return reply + content + (separator if content else "") + format_tool_calls(calls, FORMAT[family])

    engine = ScriptedEngine(lambda s: tok.encode(s, add_special_tokens=False), script, tok.convert_tokens_to_ids(IM_END))
    config = AgentConfig(tool_format=FORMAT[family], enable_thinking=thinking, show_affordances=False)
    traj = run_episodes(engine, [ScriptedShop()], tok, [EpisodeSpec(0)], SamplingParams(max_new_tokens=200), config)[0]
    return traj, seen


def conversation(thinking):
    """The episode of TURNS as chat messages, and the conversation before each assistant turn."""
    messages = [{"role": "system", "content": system_prompt("en", "multi")}, {"role": "user", "content": FIRST_PAGE}]
    before_turn = [messages[:]]
    for reasoning, content, calls in TURNS:
        turn = {"role": "assistant", "content": content, "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}} for c in calls]}
        if thinking:
            turn["reasoning_content"] = reasoning
        messages.append(turn)
        actions = [to_env_action(c) for c in calls]
        if "click[buy now]" not in actions:
            messages += [{"role": "tool", "content": PAGES[a]} for a in actions]
            before_turn.append(messages[:])
    return messages, before_turn


INCREMENTAL = [  # (template, family, enable_thinking, separator between content and calls)
    ("qwen3_5", "qwen3_5", False, "\n\n"),
    ("qwen3_5", "qwen3_5", True, "\n\n"),
    ("qwen3", "qwen3", True, "\n"),
    ("project", "qwen3_5", False, "\n\n"),
    ("project", "qwen3_5", True, "\n\n"),
    ("project", "qwen3", False, "\n\n"),
    ("project", "qwen3", True, "\n\n"),
]


@pytest.mark.parametrize("template, family, thinking, separator", INCREMENTAL)
def test_agent_loop_feeds_the_engine_what_apply_chat_template_renders(template, family, thinking, separator):
    tok = tokenizer_with(template, family)
    check_template(tok, tool_format=FORMAT[family], enable_thinking=thinking)
    traj, seen = play(tok, family, thinking, separator)
    messages, before_turn = conversation(thinking)
    assert traj.done and traj.success and traj.repairs == 0 and len(seen) == len(TURNS) == 3
    tools = tools_for("multi")
    for k, (ids, history) in enumerate(zip(seen, before_turn)):
        # Each prompt, with the last turn's: the conversation so far and its generation prompt.
        assert ids == prompt_ids(tok, history, tools=tools, enable_thinking=thinking), f"turn {k}"
    full = tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False, enable_thinking=thinking)
    end = len(full) - full[::-1].index(tok.convert_tokens_to_ids(IM_END))
    assert traj.token_ids == full[:end]  # the trajectory stops at the last sampled <|im_end|>
    text = tok.decode(traj.token_ids, skip_special_tokens=False)
    assert text.count("<|im_start|>user\n<tool_response>") == 2 and text.count("<tool_response>") == 3
    assert all(r in text for r, _, _ in TURNS) == thinking


def test_multimodal_prompt_renders_incrementally():
    """An image in the first user turn becomes the vision placeholders; appending still matches."""
    tok = tokenizer_with("qwen3_5", "qwen3_5")
    messages = [{"role": "system", "content": "You are a shopping assistant."},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find this pillow."}]}]
    ids = prompt_ids(tok, messages, tools=tools_for("single"), enable_thinking=False)
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    start = tok.convert_tokens_to_ids("<|vision_start|>")
    assert ids[ids.index(start):ids.index(start) + 3] == [start, pad, tok.convert_tokens_to_ids("<|vision_end|>")]
    call = ToolCall("search", {"keywords": "blue latex pillow"})
    ids += tok.encode(format_tool_calls([call], "xml") + IM_END, add_special_tokens=False)
    ids += tok.encode(continuation_text(tool_responses=["Page 1 [SEP] B0001"], tokenizer=tok), add_special_tokens=False)
    messages += [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "search",
                                                                                  "arguments": dict(call.arguments)}}]},
                 {"role": "tool", "content": "Page 1 [SEP] B0001"}]
    assert ids == prompt_ids(tok, messages, tools=tools_for("single"), enable_thinking=False)


# Variants of Qwen3.5's template: (text replaced, replacement). The first two keep reasoning on
# fewer turns, as R1-style templates do: only on the last message, or only on the latest assistant
# turn. The third numbers tool responses by their place in the conversation, which a stand-in
# conversation cannot know, so only the whole probe episode shows it.
VARIANTS = {
    "last_message": ("{%- if loop.index0 > query.index %}", "{%- if loop.last %}"),
    "latest_assistant": ("{%- if loop.index0 > query.index %}", "{%- if messages[loop.index0 + 1:] "
                         "| selectattr('role', 'equalto', 'assistant') | list | length == 0 %}"),
    "numbered_responses": ("'\\n<tool_response>\\n' ~ content",
                           "'\\n<tool_response id=' ~ loop.index0 ~ '>\\n' ~ content"),
}


@pytest.mark.parametrize("template, family, thinking, message", [
    ("qwen3", "qwen3", False, r"drops the <think> block .* of the assistant turn before when tool responses follow"
                              r".*Fix: set agent\.enable_thinking=True"),
    ("last_message", "qwen3_5", True, r"drops the <think> block .* of the assistant turn before when tool responses "
                                      r"follow.*Fix: save a template that renders history as sampled"),
    ("latest_assistant", "qwen3_5", True, r"drops the <think> block .* of an earlier assistant turn when a later one "
                                          r"follows.*Fix: save a template"),
    ("numbered_responses", "qwen3_5", False, r"renders a turn differently in one render of the whole conversation"),
    ("qwen3", "qwen3_5", True, r"writes tool calls as .* the 'xml' format .* does not parse"),
    ("qwen3_5", "qwen3", False, r"writes tool calls as .* the 'json' format .* does not parse"),
])
def test_templates_that_cannot_render_incrementally_are_refused(template, family, thinking, message):
    tok = tokenizer_with("qwen3_5" if template in VARIANTS else template, family)
    if template in VARIANTS:
        old, new = VARIANTS[template]
        assert tok.chat_template.count(old) == 1
        tok.chat_template = tok.chat_template.replace(old, new)
    with pytest.raises(ChatTemplateError, match=message):
        check_template(tok, tool_format=FORMAT[family], enable_thinking=thinking)


def test_a_template_that_ignores_reasoning_is_refused_when_thinking():
    tok = tokenizer_with("project", "qwen3_5")
    tok.chat_template = tok.chat_template.replace("(message.reasoning_content or '')", "''")
    check_template(tok, tool_format="xml", enable_thinking=False)
    with pytest.raises(ChatTemplateError, match=r"does not render an assistant turn's reasoning.*enable_thinking=False"):
        check_template(tok, tool_format="xml", enable_thinking=True)


def test_the_loop_itself_refuses_a_template_that_rewrites_history():
    """Without the load check, the first appended turn raises instead of diverging silently."""
    tok = tokenizer_with("qwen3", "qwen3")
    with pytest.raises(ChatTemplateError, match="drops the <think> block"):
        play(tok, "qwen3", False, "\n")


@pytest.mark.parametrize("template", ["qwen3_5", "qwen3"])
def test_a_new_user_turn_is_refused_where_it_strips_earlier_reasoning(template):
    """Both real templates drop the think block of turns before the last user query; the agent
    loop appends tool responses only, so its episodes never meet this."""
    tok = tokenizer_with(template, template)
    with pytest.raises(ChatTemplateError, match="when a user turn follows"):
        continuation_text(user="Actually, green.", enable_thinking=True, tokenizer=tok)
    prompt = "<|im_start|>assistant\n<think>\n" if template == "qwen3_5" else "<|im_start|>assistant\n"
    appended = continuation_text(tool_responses=["ok"], enable_thinking=True, tokenizer=tok)
    assert appended == "\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n" + prompt


def test_project_continuation_is_the_chatml_it_always_was():
    assert continuation_text(tool_responses=["A", " B\n"]) == (
        "\n<|im_start|>user\n<tool_response>\nA\n</tool_response>\n<tool_response>\n B\n\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert continuation_text(user=" hurry ", enable_thinking=True) == (
        "\n<|im_start|>user\nhurry<|im_end|>\n<|im_start|>assistant\n<think>\n")


def test_checkpoint_template_is_checked_when_the_tokenizer_is_loaded(tmp_path):
    from intraskill_jax.policy import load_tokenizer

    tokenizer_with("qwen3", "qwen3").save_pretrained(tmp_path)
    with pytest.raises(ChatTemplateError, match=f"chat template of {tmp_path}.*drops the <think> block"):
        load_tokenizer(tmp_path, AgentConfig(tool_format="json"))
    tok = load_tokenizer(tmp_path, AgentConfig(tool_format="json", enable_thinking=True))
    assert "<tool_response>" in tok.chat_template


# -- the first official template: SmolLM2-Instruct's ChatML, read from the registry's GGUF -------
# Fetched and converted at test time (`tests/models/gguf_files.smollm2`), never committed. It has
# no tool branch: the agent loop writes the tools into the system turn and the calls into the
# replies as text, in the Llama family's JSON format, and the tool responses are 'tool' turns.


@pytest.fixture(scope="module")
def smollm2_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests.models import gguf_files

    return AutoTokenizer.from_pretrained(str(gguf_files.smollm2(tmp_path_factory).hf_dir))


def written_as_text(messages, style):
    """`messages` as this template must receive them, written out here: the preamble after the
    system text, each call block after its turn's content (the project's separator)."""
    from intraskill_jax.tokenization import ToolText, tool_preamble

    out = [dict(m) for m in messages]
    out[0]["content"] += "\n\n" + tool_preamble(tools_for("multi"), ToolText("json", style))
    for m in out:
        calls = [ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in m.pop("tool_calls", [])]
        if calls:
            m["content"] = (m["content"] + "\n\n" if m["content"] else "") + format_tool_calls(calls, "json")
    return out


@pytest.mark.parametrize("style", ["full", "compact"])
def test_smollm2s_own_template_renders_incrementally(smollm2_tokenizer, style):
    tok = smollm2_tokenizer
    assert tok.chat_template.startswith("{% for message in messages %}") and "tool" not in tok.chat_template
    check_template(tok, tool_format="json", enable_thinking=False, tool_style=style)
    seen = []

    def script(session, ids):
        _, content, calls = TURNS[len(seen)]
        seen.append(list(ids))
        return content + ("\n\n" if content else "") + format_tool_calls(calls, "json")

    engine = ScriptedEngine(lambda s: tok.encode(s, add_special_tokens=False), script, tok.convert_tokens_to_ids(IM_END))
    config = AgentConfig(tool_format="json", tool_preamble=style, show_affordances=False)
    traj = run_episodes(engine, [ScriptedShop()], tok, [EpisodeSpec(0)], SamplingParams(max_new_tokens=200), config)[0]
    assert traj.done and traj.success and traj.repairs == 0 and len(seen) == 3
    messages, before_turn = conversation(thinking=False)
    for k, (ids, history) in enumerate(zip(seen, before_turn)):
        expected = tok.apply_chat_template(written_as_text(history, style), add_generation_prompt=True, tokenize=True,
                                           return_dict=False)
        assert ids == expected, f"turn {k}"
    full = tok.apply_chat_template(written_as_text(messages, style), tokenize=True, return_dict=False)
    end = len(full) - full[::-1].index(tok.convert_tokens_to_ids(IM_END))
    assert traj.token_ids == full[:end]
    text = tok.decode(traj.token_ids, skip_special_tokens=False)
    assert text.count("<|im_start|>tool\n") == 3 and text.count('<|im_start|>assistant\n<tool_call>\n{"name"') == 2
    assert "You are a helpful AI assistant named SmolLM" not in text  # our system turn replaces its default


@pytest.mark.parametrize("change, thinking, message", [
    (None, True, r"does not render an assistant turn's reasoning.*enable_thinking=False"),
    # (the template's string literals hold real newlines)
    (("'<|im_end|>' + '\n'", "'\n'"), False, r"does not end assistant turns with <\|im_end\|>"),
    (("message['content'] + '<|im_end|>'", "(message['content'] if loop.last else message['content'][:40]) + "
      "'<|im_end|>'"), False, r"renders an earlier assistant turn differently when a later one follows"),
])
def test_smollm2s_own_template_is_refused_where_it_cannot_hold(smollm2_tokenizer, change, thinking, message):
    """Its template as shipped cannot keep reasoning; edited to end turns otherwise or to shorten
    history, it cannot be appended to. Each is refused at load, naming the property."""
    tok = copy.copy(smollm2_tokenizer)
    if change is not None:
        old, new = change
        assert tok.chat_template.count(old) == 1
        tok.chat_template = tok.chat_template.replace(old, new)
    with pytest.raises(ChatTemplateError, match=message):
        check_template(tok, tool_format="json", enable_thinking=thinking)


def test_tools_are_written_as_text_only_where_the_template_has_no_tool_branch():
    from intraskill_jax.tokenization import ToolText, template_writes_tools
    from tests.models.gguf_files import CHATML

    assert template_writes_tools(chat_template("json")) and template_writes_tools(chat_template("xml", "compact"))
    assert not template_writes_tools(CHATML)
    tok = tokenizer_with("project", "qwen3")
    messages = [{"role": "system", "content": "Shop."}, {"role": "user", "content": "Find a pillow."}]
    native = prompt_ids(tok, messages, tools=tools_for("single"), enable_thinking=False)
    assert native == prompt_ids(tok, messages, tools=tools_for("single"), enable_thinking=False,
                                tool_text=ToolText("xml", "compact"))  # ignored: the template writes its tools
    tok.chat_template = CHATML
    with pytest.raises(ChatTemplateError, match="has no tool branch.*pass tool_text"):
        prompt_ids(tok, messages, tools=tools_for("single"), enable_thinking=False)
    text = tok.decode(prompt_ids(tok, messages, tools=tools_for("single"), enable_thinking=False,
                                 tool_text=ToolText("json", "compact")))
    assert text.startswith("<|im_start|>system\nShop.\n\nTools: search(keywords), click(value). Call one per turn as:")


# -- what the Qwen reconstructions reproduce of the official templates ---------------------------
# The official Qwen3 / Qwen3.5 template files cannot be fetched here and are not copied in; the
# ones in tests/data/chat_templates/ are written from their documented behaviour
# (../shared/reference/qwen3_5.md, section 9; Qwen3's dropping of past reasoning also
# ../shared/reference/grpo-and-rollouts.md, section 4). Each behaviour below quotes that text, has
# a case that renders it exactly, and names template edits that drop it; the second test applies
# each edit and asserts the case then fails, so no case passes whatever the template does.

SYSTEM = {"role": "system", "content": "Shop."}
CLICK = ("click", {"value": "B0001"})
SEARCH = ("search", {"keywords": "pillow"})


def user(content):
    return {"role": "user", "content": content}


def assistant(content="", reasoning=None, calls=()):
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    return message


def tool(content):
    return {"role": "tool", "content": content}


def render(tok, messages, **kwargs):
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


def system_turn(text):
    return text[len("<|im_start|>system\n"):text.index("<|im_end|>")]


TWO_QUERIES = [SYSTEM, user("Find a pillow."), assistant("Searching.", "r1"), user("Blue, please."),
               assistant("Found it.", "r2")]
TWO_QUERIES_RENDERED = ("<|im_start|>system\nShop.<|im_end|>\n<|im_start|>user\nFind a pillow.<|im_end|>\n"
                        "<|im_start|>assistant\nSearching.<|im_end|>\n<|im_start|>user\nBlue, please.<|im_end|>\n"
                        "<|im_start|>assistant\n<think>\nr2\n</think>\n\nFound it.<|im_end|>\n")


def reasoning_after_the_last_query_only(tok):
    assert render(tok, TWO_QUERIES) == TWO_QUERIES_RENDERED


def wrapped_tool_responses_are_not_a_query(tok):
    messages = [SYSTEM, user("Find a pillow."), assistant("", "r1", [SEARCH]),
                user("<tool_response>\nPage 1\n</tool_response>"), assistant("Done.", "r2")]
    assert "<|im_start|>assistant\n<think>\nr1\n</think>\n\n<tool_call>" in render(tok, messages)


def an_empty_think_block_without_reasoning(tok):
    assert render(tok, [SYSTEM, user("Hi."), assistant("Hello.")]).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\nHello.<|im_end|>\n")


def reasoning_split_off_the_content(tok):
    messages = [m if m["role"] != "assistant" else assistant(f"<think>\n{m['reasoning_content']}\n</think>\n\n"
                                                             f"{m['content']}") for m in TWO_QUERIES]
    assert render(tok, messages) == TWO_QUERIES_RENDERED


def tool_responses_grouped_in_one_user_turn(tok):
    messages = [SYSTEM, user("Find a pillow."), assistant("", None, [SEARCH, CLICK]), tool("A"), tool("B")]
    assert render(tok, messages).endswith("</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nA\n"
                                          "</tool_response>\n<tool_response>\nB\n</tool_response><|im_end|>\n")


def generation_prompt_thinks_by_default(tok):
    for kwargs in ({}, {"enable_thinking": True}):
        assert render(tok, [SYSTEM, user("Hi.")], add_generation_prompt=True, **kwargs).endswith(
            "<|im_end|>\n<|im_start|>assistant\n<think>\n"), kwargs


def thinking_off_closes_an_empty_think_block(tok):
    assert render(tok, [SYSTEM, user("Hi.")], add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def xml_calls_after_the_content(tok):
    text = render(tok, [SYSTEM, user("Hi."), assistant("Two steps.", "", [CLICK, SEARCH])])
    assert text.endswith("</think>\n\nTwo steps.\n\n<tool_call>\n<function=click>\n<parameter=value>\nB0001\n"
                         "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n"
                         "<parameter=keywords>\npillow\n</parameter>\n</function>\n</tool_call><|im_end|>\n")


def xml_argument_values(tok):
    call = ("search", {"keywords": "pillow", "filters": {"size": "40x60"}, "page": 2})
    text = render(tok, [SYSTEM, user("Hi."), assistant("", "", [call])])
    assert ("<parameter=keywords>\npillow\n</parameter>\n<parameter=filters>\n{\"size\": \"40x60\"}\n</parameter>\n"
            "<parameter=page>\n2\n</parameter>\n") in text


def tools_block_then_the_system_text(tok):
    tools = tools_for("single")
    turn = system_turn(render(tok, [SYSTEM, user("Hi.")], tools=tools))
    listed = "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools)
    assert turn.startswith(f"# Tools\n\nYou have access to the following functions:\n\n<tools>{listed}\n</tools>")
    assert "<IMPORTANT>" in turn and turn.endswith("</IMPORTANT>\n\nShop.")


def turns_trimmed_in_chatml(tok):
    assert render(tok, [{"role": "system", "content": "  Shop.\n"}, user(" Hi \n")]) == (
        "<|im_start|>system\nShop.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


def vision_placeholders(tok):
    parts = [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "Find this."}]
    assert render(tok, [SYSTEM, user(parts)]).endswith(
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|><|vision_start|><|video_pad|><|vision_end|>"
        "Find this.<|im_end|>\n")


def system_message_first(tok):
    with pytest.raises(jinja2.TemplateError, match="system message must come first"):
        render(tok, [user("Hi."), SYSTEM])


def a_user_query_required(tok):
    with pytest.raises(jinja2.TemplateError, match="no user query"):
        render(tok, [SYSTEM, assistant("Hello.")])


def qwen3_tools_block(tok):
    turn = system_turn(render(tok, [SYSTEM, user("Hi.")], tools=tools_for("single")))
    assert "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" in turn
    assert "<tools>\n" in turn and "\n</tools>" in turn
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in turn


def qwen3_json_calls(tok):
    text = render(tok, [SYSTEM, user("Hi."), assistant("Two steps.", None, [CLICK, SEARCH])])
    assert text.endswith('Two steps.\n<tool_call>\n{"name": "click", "arguments": {"value": "B0001"}}\n</tool_call>\n'
                         '<tool_call>\n{"name": "search", "arguments": {"keywords": "pillow"}}\n</tool_call><|im_end|>\n')


def qwen3_tool_responses_in_a_user_turn(tok):
    assert render(tok, [SYSTEM, user("Hi."), assistant("", None, [CLICK]), tool("Page 1")]).endswith(
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nPage 1\n</tool_response><|im_end|>\n")


def qwen3_thinking_switch(tok):
    prompt = [SYSTEM, user("Hi.")]
    assert render(tok, prompt, add_generation_prompt=True).endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert render(tok, prompt, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


def qwen3_drops_reasoning_before_the_last_query(tok):
    text = render(tok, TWO_QUERIES)
    assert "<|im_start|>assistant\nSearching.<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\nr2\n</think>\n\nFound it.<|im_end|>\n")


@dataclasses.dataclass(frozen=True)
class Behaviour:
    template: str  # qwen3_5 or qwen3
    documented: str  # what the reference says the official template does
    case: Callable[[Any], None]  # passes on a template that does it, fails otherwise
    drops: dict[str, tuple[tuple[str, str], ...]]  # name -> template edits (old, new) that remove it


# The templates' string literals are raw text here: a '\n' inside them is a backslash and an n.
BEHAVIOURS = [
    Behaviour("qwen3_5", "Assistant turns after [the last query] render as <|im_start|>assistant\\n<think>\\n"
              "{reasoning}\\n</think>\\n\\n{content} ... Earlier assistant turns drop their reasoning.",
              reasoning_after_the_last_query_only,
              {"kept_on_history": ((r"{%- if loop.index0 > query.index %}", r"{%- if true %}"),),
               "dropped_everywhere": ((r"{%- if loop.index0 > query.index %}", r"{%- if false %}"),)}),
    Behaviour("qwen3_5", "last_query_index is the last user message that is not just a <tool_response> wrapper.",
              wrapped_tool_responses_are_not_a_query,
              {"wrapper_counts": ((r"{%- if not (text.startswith('<tool_response>') and "
                                   r"text.endswith('</tool_response>')) %}", r"{%- if true %}"),)}),
    Behaviour("qwen3_5", "... with an empty think block if there is no reasoning.", an_empty_think_block_without_reasoning,
              {"block_only_with_reasoning": ((r"{%- if loop.index0 > query.index %}",
                                              r"{%- if loop.index0 > query.index and reasoning %}"),)}),
    Behaviour("qwen3_5", "Reasoning comes from reasoning_content, or is split off the content at </think>.",
              reasoning_split_off_the_content,
              {"no_split": ((r"{%- elif '</think>' in content %}", r"{%- elif false %}"),)}),
    Behaviour("qwen3_5", "tool messages render inside a user turn. <|im_start|>user opens it if the previous "
              "message was not a tool message. Each result is \\n<tool_response>\\n{content}\\n</tool_response>, "
              "and <|im_end|>\\n follows the last consecutive tool message.", tool_responses_grouped_in_one_user_turn,
              {"one_turn_each": (
                  (r"{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}"
                   r"{%- endif %}", r"{{- '<|im_start|>user' }}"),
                  (r"{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}",
                   r"{{- '<|im_end|>\n' }}"))}),
    Behaviour("qwen3_5", "Generation prompt: <|im_start|>assistant\\n followed by <think>\\n (thinking) ... In the "
              "4B/9B/large template, thinking is on by default.", generation_prompt_thinks_by_default,
              {"off_by_default": ((r"{%- if enable_thinking is defined and enable_thinking is false %}",
                                   r"{%- if not enable_thinking %}"),),
               "no_think_opened": ((r"{%- else %}" "\n" r"        {{- '<think>\n' }}", r"{%- else %}"),)}),
    Behaviour("qwen3_5", "... or <think>\\n\\n</think>\\n\\n (enable_thinking=false).",
              thinking_off_closes_an_empty_think_block,
              {"switch_ignored": ((r"{%- if enable_thinking is defined and enable_thinking is false %}",
                                   r"{%- if false %}"),),
               "no_empty_block": ((r"{{- '<think>\n\n</think>\n\n' }}", r"{{- '' }}"),)}),
    Behaviour("qwen3_5", "After the assistant content, each call is rendered as <tool_call>\\n<function=NAME>\\n, then "
              "<parameter=ARG>\\n{value}\\n</parameter>\\n for each argument, then </function>\\n</tool_call>. The "
              "first call is preceded by \\n\\n if there is content; later calls by \\n.", xml_calls_after_the_content,
              {"one_newline_after_content": ((r"{%- elif content | trim %}{{- '\n\n' }}",
                                              r"{%- elif content | trim %}{{- '\n' }}"),),
               "calls_run_together": ((r"{%- if not loop.first %}{{- '\n' }}", r"{%- if not loop.first %}"),)}),
    Behaviour("qwen3_5", "Values: strings verbatim, dicts/lists as JSON, anything else stringified.", xml_argument_values,
              {"python_repr": ((r"{{- value | tojson }}", r"{{- value | string }}"),)}),
    Behaviour("qwen3_5", "System turn with tools: <|im_start|>system\\n# Tools\\n\\nYou have access to the following "
              "functions:\\n\\n<tools>, then each tool as \"\\n\" + tojson(tool), then \\n</tools>. Next comes an "
              "instruction paragraph ... ends with an <IMPORTANT> reminder block. If there is a system message, it "
              "follows as \"\\n\\n\" + system_content.", tools_block_then_the_system_text,
              {"system_text_dropped": ((r"{%- if text %}{{- '\n\n' ~ text }}{%- endif %}", ""),)}),
    Behaviour("qwen3_5", "Turns use ChatML: <|im_start|>{role}\\n{content}<|im_end|>\\n. Content is trimmed.",
              turns_trimmed_in_chatml,
              {"untrimmed": ((r"{%- set content = text_of(message.content, true) | trim %}",
                              r"{%- set content = text_of(message.content, true) %}"),)}),
    Behaviour("qwen3_5", "An image becomes <|vision_start|><|image_pad|><|vision_end|>; a video uses <|video_pad|> in "
              "the same pattern.", vision_placeholders,
              {"bare_pads": ((r"{{- '<|vision_start|><|image_pad|><|vision_end|>' }}", r"{{- '<|image_pad|>' }}"),)}),
    Behaviour("qwen3_5", "the system message must come first ... otherwise the template raises.", system_message_first,
              {"no_check": ((r"{{- raise_exception('the system message must come first') }}", ""),)}),
    Behaviour("qwen3_5", "at least one real user query is required, otherwise the template raises.",
              a_user_query_required,
              {"no_check": ((r"{{- raise_exception('the conversation has no user query') }}", ""),)}),
    Behaviour("qwen3", "Tools block: It begins # Tools\\n\\nYou may call one or more functions to assist with the "
              "user query. The functions follow inside <tools></tools>. An instruction says to return a JSON object "
              "{\"name\": …, \"arguments\": …} inside <tool_call></tool_call>.", qwen3_tools_block,
              {"xml_instruction": ((r'{"name": <function-name>, "arguments": <args-json-object>}',
                                    r"<function=function-name>"),)}),
    Behaviour("qwen3", "Calls are JSON, not XML.", qwen3_json_calls,
              {"python_repr": ((r"(f.arguments | tojson)", r"(f.arguments | string)"),)}),
    Behaviour("qwen3", "Tool results: <|im_start|>user\\n<tool_response>\\n…\\n</tool_response><|im_end|>.",
              qwen3_tool_responses_in_a_user_turn,
              {"tool_role": ((r"{{- '<|im_start|>user' }}", r"{{- '<|im_start|>tool\n' }}"),)}),
    Behaviour("qwen3", "Thinking: enable_thinking=False appends <think>\\n\\n</think>\\n\\n to the generation prompt. "
              "Hybrid Qwen3 thinks by default.", qwen3_thinking_switch,
              {"off_by_default": ((r"{%- if enable_thinking is defined and enable_thinking is false %}",
                                   r"{%- if not enable_thinking %}"),),
               "no_empty_block": ((r"{{- '<think>\n\n</think>\n\n' }}", ""),)}),
    Behaviour("qwen3", "Qwen3 strips past <think> (grpo-and-rollouts.md, section 4): turns before the last user "
              "query lose their reasoning.", qwen3_drops_reasoning_before_the_last_query,
              {"kept_on_history": ((r"{%- if loop.index0 > query.index and (loop.last or reasoning) %}",
                                    r"{%- if loop.last or reasoning %}"),)}),
]


@pytest.fixture(scope="module")
def qwen_tokenizers():
    return {name: tokenizer_with(name, name) for name in ("qwen3_5", "qwen3")}


def edited(tok, edits):
    tok = copy.copy(tok)
    for old, new in edits:
        assert tok.chat_template.count(old) == 1, old
        tok.chat_template = tok.chat_template.replace(old, new)
    return tok


@pytest.mark.parametrize("behaviour", BEHAVIOURS, ids=lambda b: f"{b.template}-{b.case.__name__}")
def test_the_reconstruction_does_what_the_official_template_is_documented_to_do(qwen_tokenizers, behaviour):
    behaviour.case(qwen_tokenizers[behaviour.template])


@pytest.mark.parametrize("behaviour, drop", [(b, name) for b in BEHAVIOURS for name in b.drops],
                         ids=lambda x: x if isinstance(x, str) else f"{x.template}-{x.case.__name__}")
def test_each_behaviours_case_fails_where_the_template_drops_it(qwen_tokenizers, behaviour, drop):
    tok = edited(qwen_tokenizers[behaviour.template], behaviour.drops[drop])
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        behaviour.case(tok)
