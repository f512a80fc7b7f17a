"""Token-in-token-out rendering under templates with the structure of real checkpoints' ones.

`tests/data/chat_templates/` holds test templates written here with the structure of Qwen3.5's
(multimodal content, think blocks after the last user query, grouped tool responses, XML calls)
and Qwen3's (JSON calls, a think block on earlier turns only around non-empty reasoning). Under
each, the agent loop (a ScriptedEngine policy in a scripted shop) must hand the engine, turn after
turn, exactly `apply_chat_template` of the conversation so far with its generation prompt; where
that cannot hold, `check_template` must refuse at load and name the property.
"""

import copy
import dataclasses
import types
from pathlib import Path

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
