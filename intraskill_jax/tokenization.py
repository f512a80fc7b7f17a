"""Chat rendering and tool calls in the two formats of the Qwen families.

A `ToolFormat` names how a chat template writes tool calls: 'xml' (Qwen3.5:
`<function=NAME><parameter=KEY>value</parameter></function>`) or 'json' (Qwen3, Hermes-style:
`{"name": NAME, "arguments": {...}}`), each inside `<tool_call>` tags. A model family names its
format (`models/families.py`); everything here is keyed by the format, so two families that write
calls alike share one, and this module needs nothing from the models.

Episodes are token-in-token-out: the prompt is rendered once by the tokenizer's own chat template
(`prompt_ids`), sampled ids are kept verbatim, and each later turn *appends* the ids of
`continuation_text` (tool responses, then the next generation prompt). History is never
re-templated, so what the trainer scores is exactly what the sampler saw. The appended text is
what the template itself renders at that point, found by rendering it, so a checkpoint's own
template (Qwen3.5's think blocks and grouped tool responses, Qwen3's JSON calls) is followed too.

A template with no tool branch (SmolLM2's ChatML, which renders each message's role and content
and ignores `tools`) still renders as shipped: the tools and the calls are written as text in the
family's format, the tool list in the system turn (`tool_preamble`) and each assistant turn's calls
in its content, exactly where a tool-aware template would put them.

Appending equals one `apply_chat_template` of the whole conversation only if the template renders
a finished turn the same whether or not turns follow it. Qwen3's template with thinking off, for
one, drops the empty think block of earlier turns. `check_template` decides this at load by
rendering a probe episode both ways, and says which property fails and what to do.

`chat_template` writes templates for this project in each family's format (ChatML turns, tools
listed in the system turn, Qwen3.5's XML or Qwen3's JSON calls, tool responses grouped in one
user turn) for tokenizers built here; `tests/data/chat_templates/` holds test templates with the
structure of the real checkpoints' ones.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

ToolFormat = Literal["xml", "json"]
TOOL_FORMATS: tuple[ToolFormat, ...] = get_args(ToolFormat)
TemplateStyle = Literal["full", "compact"]

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
THINK, THINK_END = "<think>", "</think>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, TOOL_CALL, TOOL_CALL_END, THINK, THINK_END,
                  "<tool_response>", "</tool_response>")
# Markup a policy must never receive from outside (skill text, observations): it would forge turns.
CONTROL_MARKUP = re.compile(r"<\|[a-z_]+\|>|</?tool_call>|</?tool_response>|</?think>|<function=|</function>|<parameter=|</parameter>")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class ParsedReply:
    """A sampled assistant turn, parsed. `error` is set (and `calls` empty) when malformed."""

    content: str
    calls: tuple[ToolCall, ...]
    error: str | None = None


SHOPPING_TOOLS: tuple[dict[str, Any], ...] = (
    {"type": "function", "function": {
        "name": "search", "description": "Search the shop for products. Only available on the search page.",
        "parameters": {"type": "object", "properties": {"keywords": {"type": "string", "description": "search keywords"}},
                       "required": ["keywords"]}}},
    {"type": "function", "function": {
        "name": "click", "description": "Click a button shown on the page: a product id, an option value, "
                                        "'buy now', 'next >', '< prev', 'back to search', 'description', 'features'.",
        "parameters": {"type": "object", "properties": {"value": {"type": "string", "description": "the button text"}},
                       "required": ["value"]}}},
    {"type": "function", "function": {
        "name": "ask_shopper", "description": "Ask the shopper a question about what they want.",
        "parameters": {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]}}},
)


def tools_for(mode: str) -> list[dict[str, Any]]:
    """The tools of a simulator mode: `ask_shopper` exists only in multi-turn mode."""
    return [t for t in SHOPPING_TOOLS if mode == "multi" or t["function"]["name"] != "ask_shopper"]


def to_env_action(call: ToolCall) -> str:
    """Maps a tool call to the simulator's action grammar; raises ValueError if it cannot."""
    key = {"search": "keywords", "click": "value", "ask_shopper": "question"}.get(call.name)
    if key is None:
        raise ValueError(f"unknown tool {call.name!r}; use search, click or ask_shopper")
    value = call.arguments.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"tool {call.name} needs a non-empty string argument {key!r}")
    verb = "ask" if call.name == "ask_shopper" else call.name
    return f"{verb}[{value.strip()}]"


def from_env_action(action: str) -> ToolCall:
    """Inverse of `to_env_action`: a simulator action as the tool call that produces it."""
    m = re.fullmatch(r"(search|click|ask)\[(.*)\]", action.strip(), re.DOTALL)
    if not m:
        raise ValueError(f"not a simulator action: {action[:80]!r}")
    verb, arg = m.groups()
    name, key = {"search": ("search", "keywords"), "click": ("click", "value"), "ask": ("ask_shopper", "question")}[verb]
    return ToolCall(name, {key: arg})


# -- rendering ----------------------------------------------------------------------------------


def format_tool_calls(calls: Sequence[ToolCall], tool_format: ToolFormat) -> str:
    """The text an assistant turn uses for its calls (what the template renders after content)."""
    blocks = []
    for call in calls:
        if tool_format == "xml":
            params = "".join(
                f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
                for k, v in call.arguments.items()
            )
            blocks.append(f"{TOOL_CALL}\n<function={call.name}>\n{params}</function>\n{TOOL_CALL_END}")
        else:
            body = json.dumps({"name": call.name, "arguments": dict(call.arguments)}, ensure_ascii=False)
            blocks.append(f"{TOOL_CALL}\n{body}\n{TOOL_CALL_END}")
    return "\n".join(blocks)


class ChatTemplateError(ValueError):
    """A chat template under which token-in-token-out rendering would not equal `apply_chat_template`."""


@dataclasses.dataclass(frozen=True)
class ToolText:
    """How tools and calls are written where a chat template has no tool branch: the calls in
    `tool_format`, the tool list in the system turn as the `style` preamble ('full': each tool's
    JSON schema, 'compact': one line of signatures). A template that renders tools ignores it."""

    tool_format: ToolFormat
    style: TemplateStyle = "full"


def _jinja(template: str, messages: Sequence[Mapping[str, Any]], *, tools: list[Any] | None,
           add_generation_prompt: bool, enable_thinking: bool = False) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([list(messages)], tools=tools, chat_template=template,
                                        add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking)
    return rendered[0]


@functools.lru_cache(maxsize=32)
def template_writes_tools(template: str) -> bool:
    """Whether a chat template renders the tool list it is given (a pure function of its text)."""
    probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    return (_jinja(template, probe, tools=list(SHOPPING_TOOLS), add_generation_prompt=True)
            != _jinja(template, probe, tools=None, add_generation_prompt=True))


def tool_preamble(tools: Sequence[Mapping[str, Any]], text: ToolText) -> str:
    """The tool list and call format a template without a tool branch gets in its system turn."""
    template = _TOOLS_PREAMBLE[text.tool_format] if text.style == "full" else _compact_preamble(text.tool_format)
    return _jinja(template, [], tools=list(tools), add_generation_prompt=False)


def _tools_as_text(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
                   text: ToolText) -> list[dict[str, Any]]:
    """`messages` with the tools written into the system turn (after its own text, as Qwen's templates
    place them) and each assistant turn's calls into its content (after it, as the project's templates
    do), so a template with no tool branch renders what a tool-aware one would."""
    out = [dict(m) for m in messages]
    preamble = tool_preamble(tools, text)
    if out and out[0]["role"] == "system":
        out[0]["content"] = f"{out[0]['content'].strip()}\n\n{preamble}"
    else:
        out.insert(0, {"role": "system", "content": preamble})
    for message in out:
        calls = message.pop("tool_calls", None)
        if message["role"] == "assistant" and calls:
            written = format_tool_calls([ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in calls],
                                        text.tool_format)
            content = (message.get("content") or "").strip()
            message["content"] = f"{content}\n\n{written}" if content else written
    return out


def _native(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, tokenizer: Any,
            tool_text: ToolText | None) -> tuple[list[Any], list[Any] | None]:
    """(messages, tools) as the tokenizer's template takes them: unchanged where it renders tools,
    else the tools and calls written as text (`_tools_as_text`)."""
    if not tools or tokenizer is None or template_writes_tools(tokenizer.chat_template or ""):
        return list(messages), list(tools) if tools is not None else None
    if tool_text is None:
        raise ChatTemplateError(f"{_template_of(tokenizer)} has no tool branch, so the tools must be written as text; "
                                "pass tool_text (the agent loop passes AgentConfig.tool_text())")
    return _tools_as_text(messages, tools, tool_text), None


def _render(messages: Sequence[Mapping[str, Any]], *, tokenizer: Any, add_generation_prompt: bool,
            enable_thinking: bool, tools: Sequence[Mapping[str, Any]] | None = None,
            tool_text: ToolText | None = None) -> str:
    """`messages` as text, rendered by the tokenizer's chat template (without a tokenizer: the
    project's XML-call template, whose turns after the system turn are those of every format)."""
    if tokenizer is None:
        return _jinja(chat_template("xml"), messages, tools=list(tools) if tools is not None else None,
                      add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking)
    messages, tools = _native(messages, tools, tokenizer, tool_text)
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                         tokenize=False, enable_thinking=enable_thinking)


def prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None,
               enable_thinking: bool, tool_text: ToolText | None = None) -> list[int]:
    """An episode's first tokens: the conversation so far and the generation prompt, by the template
    (with `tool_text` where it has no tool branch)."""
    messages, tools = _native(messages, tools, tokenizer, tool_text)
    return list(tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                              return_dict=False, enable_thinking=enable_thinking))


def continuation_text(*, tool_responses: Sequence[str] = (), user: str | None = None, enable_thinking: bool = False,
                      tokenizer: Any = None) -> str:
    """Text appended after a sampled turn (which ended with <|im_end|>) to open the next one.

    It is what the chat template (the tokenizer's; without one, the project's) renders at that
    point: the difference between a stand-in conversation rendered with the new messages and the
    generation prompt, and rendered without them, plus whatever the template writes after the
    sampled turn's <|im_end|>. Raises ChatTemplateError when the template renders the turn before
    differently once more turns follow, since appending could then never equal a full render.
    """
    if bool(tool_responses) == (user is not None):
        raise ValueError("pass either tool_responses or a user message")
    appended = ([{"role": "user", "content": user}] if user is not None
                else [{"role": "tool", "content": r} for r in tool_responses])
    # A thinking turn carries reasoning: templates that keep a think block only around non-empty
    # reasoning (Qwen3's) then render the stand-in turn alike whether or not it is the last.
    reasoning = {"reasoning_content": "ok"} if enable_thinking else {}
    base = [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "ok", **reasoning}]
    before = _render(base, tokenizer=tokenizer, add_generation_prompt=False, enable_thinking=enable_thinking)
    after = _render(base + appended, tokenizer=tokenizer, add_generation_prompt=True, enable_thinking=enable_thinking)
    end = before.rfind(IM_END)
    if end < 0:
        raise _no_end_of_turn(tokenizer)
    if not after.startswith(before):
        when = "when a user turn follows" if user is not None else "when tool responses follow"
        raise ChatTemplateError(_history_changed(before, after, tokenizer, "the assistant turn before", when,
                                                 may_think=user is None and not enable_thinking))
    return before[end + len(IM_END):] + after[len(before):]


def _template_of(tokenizer: Any) -> str:
    if tokenizer is None:
        return "the project's chat template"
    name = getattr(tokenizer, "name_or_path", "")
    return f"the chat template of {name}" if name else "the tokenizer's chat template"


def _no_end_of_turn(tokenizer: Any) -> ChatTemplateError:
    return ChatTemplateError(f"{_template_of(tokenizer)} does not end assistant turns with {IM_END}, the token the agent "
                             "loop stops sampling at; use a ChatML template such as "
                             "intraskill_jax.tokenization.chat_template(tool_format)")


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _history_changed(sampled: str, rendered: str, tokenizer: Any, subject: str, when: str, *,
                     may_think: bool = False) -> str:
    """Names what a template re-rendered: `sampled` is history as the agent loop keeps it,
    `rendered` the template's render of the same conversation with `subject` no longer last.
    `may_think`: thinking is off, and turning it on may help (a template may keep a think block
    only around non-empty reasoning)."""
    i = _first_difference(sampled, rendered)
    fix = ("save a template that renders history as sampled as the checkpoint's chat_template.jinja "
           "(intraskill_jax.tokenization.chat_template(tool_format) is one)")
    if sampled.rfind(THINK, 0, i + len(THINK)) > sampled.rfind(THINK_END, 0, i):
        what = f"it drops the {THINK} block (the reasoning) of {subject} {when}"
        if may_think:
            fix = ("set agent.enable_thinking=True (Qwen3's template keeps a turn's non-empty reasoning after the "
                   f"user's query, only an empty block is dropped), or {fix}")
    else:
        what = f"it renders {subject} differently {when}"
    return (f"{_template_of(tokenizer)} cannot be rendered token-in-token-out: {what}, so a trajectory would not "
            f"equal apply_chat_template of its own conversation (sampled ...{sampled[max(0, i - 40):i + 40]!r}, "
            f"template ...{rendered[max(0, i - 40):i + 40]!r}). Fix: {fix}.")


# -- checking a template at load ------------------------------------------------------------------

# A probe episode: the first turn only calls, the second writes content and two calls whose two
# responses share one user turn; the first response ends in whitespace a template may trim.
_PROBE_TASK = "Find me a blue latex pillow."
_PROBE_REASONING = "The shopper wants a pillow, so I search first."
_PROBE_TURNS: tuple[tuple[str, tuple[ToolCall, ...], tuple[str, ...]], ...] = (
    ("", (ToolCall("search", {"keywords": "blue latex pillow"}),),
     ("Page 1 [SEP] B0001 [SEP] Blue latex pillow, 40x60cm\n",)),
    ("Two steps at once.", (ToolCall("click", {"value": "B0001"}), ToolCall("ask_shopper", {"question": "Which size?"})),
     ("Blue latex pillow [SEP] size: 40x60 [SEP] Buy Now", "Shopper: 40x60, please.")),
)


def check_template(tokenizer: Any, *, tool_format: ToolFormat, enable_thinking: bool,
                   tool_style: TemplateStyle = "full") -> None:
    """Raises ChatTemplateError unless the agent loop's rendering equals the template's, token for token.

    Renders a probe tool-use episode two ways: as the agent loop builds it (the prompt, each
    assistant turn as a policy samples it after the generation prompt, then the appended tool
    responses and the next generation prompt) and as one `apply_chat_template` of the whole
    conversation. Deciding by rendering covers templates never seen here. Also checks that the
    template writes tool calls in `tool_format` and, when thinking, renders a turn's reasoning. A
    template with no tool branch is checked with the tools written as text (`ToolText(tool_format,
    tool_style)`), as the agent loop writes them.
    Cheap (a few renders): call it when a tokenizer is loaded, before any rollout.
    """
    from jinja2.exceptions import TemplateError

    where = _template_of(tokenizer)
    tools = tools_for("multi")
    tool_text = ToolText(tool_format, tool_style)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a shopping assistant."},
                                      {"role": "user", "content": _PROBE_TASK}]
    try:
        ids = prompt_ids(tokenizer, messages, tools=tools, enable_thinking=enable_thinking, tool_text=tool_text)
        text = _render(messages, tokenizer=tokenizer, tools=tools, add_generation_prompt=True,
                       enable_thinking=enable_thinking, tool_text=tool_text)
        for content, calls, responses in _PROBE_TURNS:
            turn: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": [
                {"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}} for c in calls]}
            if enable_thinking:
                turn["reasoning_content"] = _PROBE_REASONING
            sampled = _sampled_turn(tokenizer, messages, turn, tools, enable_thinking, tool_text)
            reply = parse_reply(sampled, tool_format)
            if reply.calls != calls:
                raise ChatTemplateError(
                    f"{where} writes tool calls as {sampled!r}, which the {tool_format!r} format of the "
                    f"checkpoint's model family does not parse ({reply.error or 'different calls'}); the template "
                    "and config.json disagree: fix the checkpoint's chat template or its model_type")
            if enable_thinking and _PROBE_REASONING not in sampled:
                raise ChatTemplateError(
                    f"{where} does not render an assistant turn's reasoning ({sampled!r}), so with "
                    "agent.enable_thinking=True what a policy reasons would vanish from its history; set "
                    "agent.enable_thinking=False or use a template that renders reasoning_content")
            continuation = continuation_text(tool_responses=responses, enable_thinking=enable_thinking,
                                             tokenizer=tokenizer)
            # Apart, as in the loop: the engine's tokens, then the appended ones.
            ids += tokenizer.encode(sampled, add_special_tokens=False)
            ids += tokenizer.encode(continuation, add_special_tokens=False)
            text += sampled + continuation
            messages += [turn] + [{"role": "tool", "content": r} for r in responses]
        full = _render(messages, tokenizer=tokenizer, tools=tools, add_generation_prompt=True,
                       enable_thinking=enable_thinking, tool_text=tool_text)
        full_ids = prompt_ids(tokenizer, messages, tools=tools, enable_thinking=enable_thinking, tool_text=tool_text)
    except TemplateError as e:
        raise ChatTemplateError(f"{where} cannot render a tool-use conversation ({e}); use a template with tool "
                                "and tool-response turns, such as intraskill_jax.tokenization.chat_template(tool_format)") from None
    if text != full:  # e.g. appended turns that depend on the conversation before them
        raise ChatTemplateError(_history_changed(text, full, tokenizer, "a turn", "in one render of the whole "
                                                 "conversation", may_think=not enable_thinking))
    if ids != full_ids:
        k = _first_difference(ids, full_ids)
        raise ChatTemplateError(
            f"{where} renders the same text both ways, but the tokenizer splits it differently at token {k} "
            f"({tokenizer.decode(ids[k:k + 4])!r} appended vs {tokenizer.decode(full_ids[k:k + 4])!r} in one piece): "
            "turn boundaries must fall on special tokens such as <|im_end|>")


def _sampled_turn(tokenizer: Any, messages: list[dict[str, Any]], turn: Mapping[str, Any],
                  tools: Sequence[Mapping[str, Any]], enable_thinking: bool, tool_text: ToolText) -> str:
    """`turn` as a policy samples it: the template's render of it as the last turn, less the
    generation prompt that opened it, through the <|im_end|> the sampler stops at."""
    render = functools.partial(_render, tokenizer=tokenizer, tools=tools, enable_thinking=enable_thinking,
                               tool_text=tool_text)
    opened = render(messages, add_generation_prompt=True)
    finished = render([*messages, turn], add_generation_prompt=False)
    if not finished.startswith(opened):
        history = render(messages, add_generation_prompt=False)
        if finished.startswith(history):
            raise ChatTemplateError(_history_changed(opened, finished, tokenizer, "the turn its generation prompt "
                                                     "opens", "once that turn is written"))
        raise ChatTemplateError(_history_changed(history, finished, tokenizer, "an earlier assistant turn",
                                                 "when a later one follows", may_think=not enable_thinking))
    body = finished[len(opened):]
    end = body.find(IM_END)
    if end < 0:
        raise _no_end_of_turn(tokenizer)
    return body[: end + len(IM_END)]


# -- parsing ------------------------------------------------------------------------------------

_CALL_BLOCK = re.compile(re.escape(TOOL_CALL) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)
_XML_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>\s*(.*?)\s*</function>\s*$", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def parse_reply(text: str, tool_format: ToolFormat) -> ParsedReply:
    """Parses one assistant turn (special tokens decoded, think block and <|im_end|> allowed).

    Never raises: malformed markup becomes `error`, which the agent loop turns into an error
    observation and counts as a repair.
    """
    text = text.replace(IM_END, "").replace(ENDOFTEXT, "")
    if THINK_END in text:
        text = text.split(THINK_END, 1)[1]
    text = text.replace(THINK, "")
    blocks = _CALL_BLOCK.findall(text)
    first = text.find(TOOL_CALL)
    content = (text if first < 0 else text[:first]).strip()
    if not blocks:
        if TOOL_CALL in text or TOOL_CALL_END in text:
            return ParsedReply(content, (), "unterminated <tool_call> block")
        return ParsedReply(content, (), "no tool call: reply with exactly one tool call")
    calls = []
    for block in blocks:
        try:
            calls.append(_parse_xml(block) if tool_format == "xml" else _parse_json(block))
        except ValueError as e:
            return ParsedReply(content, (), str(e))
    return ParsedReply(content, tuple(calls))


def _parse_xml(block: str) -> ToolCall:
    m = _XML_FUNCTION.match(block)
    if not m:
        raise ValueError("malformed tool call: expected <function=NAME> ... </function> inside <tool_call>")
    name, body = m.group(1).strip(), m.group(2)
    args = {k.strip(): v for k, v in _XML_PARAM.findall(body)}
    leftover = _XML_PARAM.sub("", body).strip()
    if leftover:
        raise ValueError(f"malformed tool call: unexpected text in <function={name}>: {leftover[:60]!r}")
    return ToolCall(name, args)


def _parse_json(block: str) -> ToolCall:
    try:
        obj = json.loads(block)
    except json.JSONDecodeError as e:
        raise ValueError(f"malformed tool call: invalid JSON ({e.msg})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("malformed tool call: expected {\"name\": ..., \"arguments\": {...}}")
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            raise ValueError("malformed tool call: arguments is not a JSON object") from None
    if not isinstance(args, dict):
        raise ValueError("malformed tool call: arguments is not a JSON object")
    return ToolCall(obj["name"], args)


# -- templates for tokenizers built here --------------------------------------------------------

_TOOLS_PREAMBLE = {
    "xml": (
        "# Tools\n\nYou have access to the following functions:\n\n<tools>"
        "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
        "To call a function, reply with exactly this format and nothing after it:\n\n"
        "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter>\nvalue\n"
        "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\n"
        "- The function block sits inside <tool_call></tool_call>.\n"
        "- Give every required parameter.\n"
        "- You may reason before the call, never after it.\n"
        "- If no function fits, answer normally.\n</IMPORTANT>"
    ),
    "json": (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "The functions are listed inside <tools></tools>:\n<tools>"
        "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools>\n\n"
        "For each call, reply with a JSON object holding the function name and arguments inside "
        "<tool_call></tool_call>:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
    ),
}


# The compact preamble lists each tool as name(required parameters) and shows the call format
# once: ~40 tokens instead of ~300, for small policies whose context is short (the CPU quickstart).
_CALL_FORMAT = {
    "xml": "<tool_call>\\n<function=NAME>\\n<parameter=ARGUMENT>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>",
    "json": "<tool_call>\\n{\"name\": NAME, \"arguments\": {ARGUMENT: value}}\\n</tool_call>",
}


def _compact_preamble(tool_format: ToolFormat) -> str:
    return (
        "{{- 'Tools: ' }}{%- for tool in tools %}{%- set f = tool.function if tool.function is defined else tool %}"
        "{{- f.name + '(' + (f.parameters.required | join(', ')) + ')' }}{%- if not loop.last %}{{- ', ' }}{%- endif %}"
        "{%- endfor %}{{- '. Call one per turn as:\\n" + _CALL_FORMAT[tool_format] + "' }}"
    )


def _assistant_calls(tool_format: ToolFormat) -> str:
    if tool_format == "xml":
        return (
            "{%- for tc in message.tool_calls %}{%- set f = tc.function if tc.function is defined else tc %}"
            "{%- if loop.first %}{%- if content %}{{ '\\n\\n' }}{%- endif %}{%- else %}{{ '\\n' }}{%- endif %}"
            "{{ '<tool_call>\\n<function=' + f.name + '>\\n' }}"
            "{%- for k, v in f.arguments.items() %}{{ '<parameter=' + k + '>\\n' }}"
            "{%- if v is string %}{{ v }}{%- else %}{{ v | tojson }}{%- endif %}{{ '\\n</parameter>\\n' }}{%- endfor %}"
            "{{ '</function>\\n</tool_call>' }}{%- endfor %}"
        )
    return (
        "{%- for tc in message.tool_calls %}{%- set f = tc.function if tc.function is defined else tc %}"
        "{%- if loop.first %}{%- if content %}{{ '\\n\\n' }}{%- endif %}{%- else %}{{ '\\n' }}{%- endif %}"
        "{{ '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' + (f.arguments | tojson) + '}\\n</tool_call>' }}"
        "{%- endfor %}"
    )


def chat_template(tool_format: ToolFormat, style: TemplateStyle = "full") -> str:
    """A Jinja chat template writing tool calls in `tool_format`, as the families document it
    (ChatML turns, tools in the system turn, tool results inside user turns, a think block holding
    `reasoning_content` on every assistant turn, empty without it), under which appending renders
    history as sampled.

    `style='compact'` shortens only the tool preamble of the system turn (see `_compact_preamble`);
    every turn after it, and so every sampled or appended token, is the same in both styles.
    """
    if style not in ("full", "compact"):
        raise ValueError(f"template style must be 'full' or 'compact', got {style!r}")
    preamble = _TOOLS_PREAMBLE[tool_format] if style == "full" else _compact_preamble(tool_format)
    return (
        "{%- if messages[0].role == 'system' %}{%- set sys = messages[0].content | trim %}{%- set rest = messages[1:] %}"
        "{%- else %}{%- set sys = '' %}{%- set rest = messages %}{%- endif %}"
        "{%- if tools %}{{ '<|im_start|>system\\n' }}" + preamble +
        "{%- if sys %}{{ '\\n\\n' + sys }}{%- endif %}{{ '<|im_end|>\\n' }}"
        "{%- elif sys %}{{ '<|im_start|>system\\n' + sys + '<|im_end|>\\n' }}{%- endif %}"
        "{%- for message in rest %}"
        "{%- if message.role == 'user' %}{{ '<|im_start|>user\\n' + (message.content | trim) + '<|im_end|>\\n' }}"
        "{%- elif message.role == 'assistant' %}{%- set content = (message.content or '') | trim %}"
        "{{ '<|im_start|>assistant\\n<think>\\n' + ((message.reasoning_content or '') | trim) + '\\n</think>\\n\\n' + content }}"
        "{%- if message.tool_calls %}" + _assistant_calls(tool_format) + "{%- endif %}{{ '<|im_end|>\\n' }}"
        "{%- elif message.role == 'tool' %}"
        "{%- if loop.first or rest[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}"
        "{{ '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
        "{%- if loop.last or rest[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{%- endif %}"
        "{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
        "{%- if enable_thinking is defined and enable_thinking %}{{ '<think>\\n' }}"
        "{%- else %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
    )


# The pre-tokenizer regex of Qwen2/Qwen3/Qwen3.5 tokenizers (their tokenizer.json).
QWEN_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                      r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_tokenizer(texts, vocab_size: int, tool_format: ToolFormat = "xml", template: TemplateStyle = "full"):
    """Trains a byte-level BPE tokenizer on `texts` with the Qwen special tokens and the template
    `chat_template(tool_format, template)`.

    Returns a `transformers.PreTrainedTokenizerFast` (save it with `save_pretrained`), so a model
    built here loads through exactly the path a real checkpoint uses.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Qwen's own split: every digit is a token and no space is glued to a number, so a product id
    # reads the same on a results page (" 14321") and in a tool call ("\n14321\n"). GPT-2's split
    # made those two different token strings, and a small policy could never learn to copy ids.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (IM_END, ENDOFTEXT)],
        chat_template=chat_template(tool_format, template),
        clean_up_tokenization_spaces=False,
    )
