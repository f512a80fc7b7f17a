"""Chat rendering: our incremental, token-in-token-out rendering against `apply_chat_template`."""

import json

import pytest

from intraskill_jax.tokenization import (
    IM_END,
    ToolCall,
    continuation_text,
    format_tool_calls,
    parse_reply,
    to_env_action,
    tools_for,
    train_tokenizer,
)

CORPUS = [
    "search for a latex kids pillow under 60 dollars, color blue, size 40x60cm",
    "我想买一款儿童乳胶枕头，颜色分类选蓝色，价格在60.00元以内。",
    "Back to Search [SEP] Page 1 (Total results: 150) [SEP] Next > [SEP] 140586786076 [SEP] Veden pillow",
    '{"name": "click", "arguments": {"value": "buy now"}} <function=search> <parameter=keywords>',
] * 20


@pytest.fixture(scope="module", params=["xml", "json"])
def tokenizer(request):
    tok = train_tokenizer(CORPUS, vocab_size=600, tool_format=request.param)
    tok.tool_format = request.param
    return tok


def conversation(tool_format):
    calls = [ToolCall("search", {"keywords": "latex kids pillow"})]
    second = [ToolCall("click", {"value": "140586786076"}), ToolCall("ask_shopper", {"question": "which color?"})]
    return [
        {"role": "system", "content": "You are a shopping assistant.\nFollow the skill."},
        {"role": "user", "content": "I want to buy a pillow."},
        {"role": "assistant", "content": "Let me search.", "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}} for c in calls]},
        {"role": "tool", "content": "Back to Search [SEP] Page 1 (Total results: 150)"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}} for c in second]},
        {"role": "tool", "content": "item page"},
        {"role": "tool", "content": "Shopper: blue, please."},
        {"role": "user", "content": "Please hurry."},
    ], calls, second


def test_incremental_rendering_equals_apply_chat_template(tokenizer):
    tool_format = tokenizer.tool_format
    messages, calls, second = conversation(tool_format)
    messages = messages[:-1]  # ends with tool responses; a user turn is tested below
    tools = tools_for("multi")
    ids = tokenizer.apply_chat_template(messages[:2], tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
    # The sampler produces the assistant text and stops on <|im_end|>; those ids are kept verbatim.
    ids += tokenizer.encode("Let me search.\n\n" + format_tool_calls(calls, tool_format) + IM_END, add_special_tokens=False)
    ids += tokenizer.encode(continuation_text(tool_responses=[messages[3]["content"]]), add_special_tokens=False)
    ids += tokenizer.encode(format_tool_calls(second, tool_format) + IM_END, add_special_tokens=False)
    ids += tokenizer.encode(continuation_text(tool_responses=["item page", "Shopper: blue, please."]), add_special_tokens=False)
    want = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids == want
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_user_continuation_matches_template(tokenizer):
    messages, calls, _ = conversation(tokenizer.tool_format)
    msgs = messages[:3] + [{"role": "user", "content": "  Please hurry.  "}]
    want = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    ids = tokenizer.apply_chat_template(messages[:2], add_generation_prompt=True, tokenize=True, return_dict=False)
    ids += tokenizer.encode("Let me search.\n\n" + format_tool_calls(calls, tokenizer.tool_format) + IM_END, add_special_tokens=False)
    ids += tokenizer.encode(continuation_text(user="  Please hurry.  "), add_special_tokens=False)
    assert ids == want


def test_tools_are_rendered_in_the_system_turn(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=tools_for("single"), tokenize=False)
    assert text.startswith("<|im_start|>system\n# Tools")
    assert json.dumps(tools_for("single")[0], ensure_ascii=False) in text or '"name": "search"' in text
    assert "ask_shopper" not in text


@pytest.mark.parametrize("tool_format", ["xml", "json"])
def test_parse_round_trips_formatted_calls(tool_format):
    calls = (ToolCall("click", {"value": "buy now"}), ToolCall("search", {"keywords": "乳胶 枕头 [kids]"}))
    reply = parse_reply("<think>\nhmm\n</think>\n\nI will buy.\n\n" + format_tool_calls(calls, tool_format) + IM_END, tool_format)
    assert reply.error is None and reply.calls == calls and reply.content == "I will buy."
    assert [to_env_action(c) for c in reply.calls] == ["click[buy now]", "search[乳胶 枕头 [kids]]"]


@pytest.mark.parametrize(
    "tool_format, text, error",
    [
        ("xml", "just talking", "no tool call"),
        ("xml", "<tool_call>\n<function=click>\n<parameter=value>\nx\n</parameter>\n", "unterminated"),
        ("xml", "<tool_call>\n<function=click>\nvalue=x\n</function>\n</tool_call>", "unexpected text"),
        ("xml", "<tool_call>{\"name\": \"click\"}</tool_call>", "expected <function=NAME>"),
        ("json", "<tool_call>\n{\"name\": \"click\", \"arguments\": {\"value\": \"x\"}\n</tool_call>", "invalid JSON"),
        ("json", "<tool_call>\n[1, 2]\n</tool_call>", "expected {"),
        ("json", "<tool_call>\n{\"name\": \"click\", \"arguments\": \"oops\"}\n</tool_call>", "not a JSON object"),
    ],
)
def test_malformed_calls_become_errors_not_exceptions(tool_format, text, error):
    reply = parse_reply(text, tool_format)
    assert reply.calls == () and error in reply.error


def test_env_action_mapping_rejects_bad_calls():
    assert to_env_action(ToolCall("ask_shopper", {"question": " size? "})) == "ask[size?]"
    with pytest.raises(ValueError, match="unknown tool"):
        to_env_action(ToolCall("checkout", {}))
    with pytest.raises(ValueError, match="non-empty string"):
        to_env_action(ToolCall("click", {"value": 3}))


def test_pretokenizer_is_qwens_split():
    """Pre-tokens equal the Qwen regex applied by the `regex` module (the HF tokenizer.json split)."""
    regex = pytest.importorskip("regex")
    from intraskill_jax.tokenization import QWEN_SPLIT_PATTERN

    tok = train_tokenizer(CORPUS, vocab_size=600)
    text = "I'm looking for 2 pillows:\n\n  size 40x60cm, price < 60.00 [SEP] 140586786076 ok?\r\n"
    pieces = [p for p, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    decoded = [tok.convert_tokens_to_string([p]) for p in pieces]
    assert decoded == regex.findall(QWEN_SPLIT_PATTERN, text)


@pytest.mark.parametrize("tool_format", ["xml", "json"])
def test_product_ids_tokenize_alike_on_pages_and_in_calls(tokenizer, tool_format):
    """The policy copies an id from a results page into a call: both must be the same tokens."""
    pid = "140586786076"
    page = tokenizer.encode(f"Next > [SEP] {pid} [SEP] Veden pillow", add_special_tokens=False)
    call = tokenizer.encode(format_tool_calls([ToolCall("click", {"value": pid})], tool_format), add_special_tokens=False)
    digits = [tokenizer.convert_tokens_to_ids(d) for d in pid]
    assert all(isinstance(d, int) and d != tokenizer.unk_token_id for d in digits)

    def contains(seq, sub):
        return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))

    assert contains(page, digits) and contains(call, digits)
