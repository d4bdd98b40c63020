"""Chat templates and the assistant mask (posttrain/chat.py), against transformers' own assistant mask."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posttrain.chat import ChatML, ChatTokenizer, chat_tokenizer, check_messages, resolve_chat
from posttrain.errors import ConfigError, DataError
from posttrain.tokenizers import load

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": " hi, how are you?\n"},
        {"role": "user", "content": "and 4+4?"},
        {"role": "assistant", "content": "8 #### 8"},
    ],
    [
        {"role": "user", "content": "Ünïcode ✓ and\ttabs"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "  spaced  "},
    ],
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, chat_helpers):
    return chat_helpers.build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load(tok_dir / "tokenizer.json")


@pytest.fixture(scope="module")
def hf_tok(tok_dir):
    transformers = pytest.importorskip("transformers")
    cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tok_dir / "tokenizer.json"), **{k: v for k, v in cfg.items() if k.endswith("_token")}
    )
    hf.chat_template = cfg["chat_template"]
    return hf


@pytest.mark.parametrize("spec", ["auto", "chatml"])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_mask_equals_transformers_assistant_mask_token_by_token(tok, tok_dir, hf_tok, spec, conv):
    msgs = CONVERSATIONS[conv]
    chat = resolve_chat(spec, tok, [tok_dir])
    ids, mask = chat.encode(msgs)
    ref = hf_tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    n = len(ids) - 1  # ours: [BOS] + everything up to the last reply's end marker
    assert ids[0] == tok.bos_id and mask[0] == 0
    for t in range(n):  # token by token: the same token, and assistant iff transformers says so
        assert ids[1 + t] == ref["input_ids"][t], t
        assert mask[1 + t] == ref["assistant_masks"][t], (t, tok.id_to_token(ids[1 + t]))
    assert not any(ref["assistant_masks"][n:])  # what we leave out is not assistant text


def test_mask_honours_train_from_and_generation_prompt(tok):
    chat = resolve_chat("chatml", tok)
    msgs = CONVERSATIONS[1]
    ids, mask = chat.encode(msgs, train_from=4)  # only the last reply carries the loss
    assert tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False) == "8 #### 8<|im_end|>"
    assert chat.prompt_text(msgs[:2]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert chat.prompt_text("2+3=") == "<|im_start|>user\n2+3=<|im_end|>\n<|im_start|>assistant\n"
    assert chat.completion_text("2+3=", "5") == "5"  # the end marker is the stop token: the encoder's EOS
    assert chat.completion_text([{"role": "user", "content": "q"}], [{"role": "assistant", "content": "a b"}]) == "a b"


_text = st.text(alphabet=st.sampled_from(list("ab xyz019+=?\n\t.,é✓#")), max_size=12)


@st.composite
def conversations(draw):
    n = draw(st.integers(1, 6))
    msgs = [{"role": draw(st.sampled_from(["system", "user", "assistant"])), "content": draw(_text)} for _ in range(n)]
    if not any(m["role"] == "assistant" for m in msgs):
        msgs.append({"role": "assistant", "content": draw(_text)})
    return msgs


@given(msgs=conversations())
def test_property_masked_tokens_decode_to_the_assistant_contents_and_end_markers(tok, msgs):
    chat = resolve_chat("chatml", tok)
    ids, mask = chat.encode(msgs)
    masked = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert masked == "".join(m["content"] + "<|im_end|>" for m in msgs if m["role"] == "assistant")
    # the whole sequence is the rendered conversation, up to the end of the last reply
    last = max(k for k, m in enumerate(msgs) if m["role"] == "assistant")
    assert tok.decode(ids[1:], skip_special_tokens=False) == ChatML().render(msgs[: last + 1]).rstrip("\n")
    # one run of masked tokens per reply (every reply has at least its end marker)
    runs = sum(1 for t in range(len(mask)) if mask[t] and (t == 0 or not mask[t - 1]))
    assert runs == sum(m["role"] == "assistant" for m in msgs)


@pytest.mark.parametrize(
    "value, reason",
    [
        ([], "field 'messages' is an empty conversation"),
        ("hi", "field 'messages' must be a list of messages, got str"),
        ([{"role": "robot", "content": "x"}], "messages[0]: role 'robot' is not one of system, user, assistant"),
        ([{"role": "user"}], "messages[0] has no 'content'"),
        ([{"role": "user", "content": 3}], "messages[0]: 'content' must be a string, got int"),
        ([{"role": "user", "content": "x"}], "field 'messages' has no assistant message (nothing to train on)"),
        (["x"], "messages[0] must be an object with 'role' and 'content', got str"),
    ],
)
def test_bad_conversations_say_why(value, reason):
    assert check_messages(value, need_assistant=True) == (None, reason)


def test_text_parts_are_joined():
    msgs, _ = check_messages(
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    )
    assert msgs == [{"role": "user", "content": "ab"}]


def test_template_resolution(tmp_path, tok, tok_dir, chat_helpers):
    CHATML_GENERATION = chat_helpers.CHATML_GENERATION
    bare = chat_helpers.build_tokenizer(tmp_path / "bare", template=None)
    plain = load(bare / "tokenizer.json")
    assert resolve_chat("auto", plain, [bare]) is None and resolve_chat("none", tok, [tok_dir]) is None
    with pytest.raises(ConfigError, match="the tokenizer has no chat template"):
        resolve_chat("tokenizer", plain, [bare])
    with pytest.raises(ConfigError, match="not one of auto, tokenizer, none, chatml and not a file"):
        resolve_chat("chatmlx", tok)
    jinja = tmp_path / "t.jinja"
    jinja.write_text(CHATML_GENERATION)
    by_file = resolve_chat(str(jinja), tok)
    assert by_file.wrap_strings and by_file.encode(CONVERSATIONS[1]) == resolve_chat("chatml", tok).encode(
        CONVERSATIONS[1]
    )
    (tmp_path / "chat_template.jinja").write_text(CHATML_GENERATION)  # what transformers >= 4.43 saves
    assert resolve_chat("auto", plain, [tmp_path]).name.endswith("chat_template.jinja)")


def test_chatml_needs_its_tokens():
    from posttrain.tokenizers.char import CharTokenizer

    with pytest.raises(ConfigError, match=r"needs the token '<\|im_start\|>'"):
        resolve_chat("chatml", CharTokenizer("0123456789+="))


def test_template_without_end_marker_gets_eos(tmp_path, tok):
    t = tmp_path / "plain.jinja"
    t.write_text(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    chat = resolve_chat(str(t), tok)
    assert chat.end_marker == "" and chat.stop_id is None and chat_tokenizer(tok, chat).eos_id == tok.eos_id
    ids, mask = chat.encode([{"role": "user", "content": "q"}, {"role": "assistant", "content": "yes"}])
    assert [i for i, m in zip(ids, mask) if m][-1] == tok.eos_id
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == "yes"


def test_template_that_rewrites_earlier_turns_is_refused(tmp_path, tok):
    t = tmp_path / "drop.jinja"  # shows only the last assistant reply (as reasoning templates drop old thoughts)
    t.write_text(
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>{% endif %}{% endfor %}"
    )
    chat = resolve_chat(str(t), tok)
    with pytest.raises(DataError, match="does not render this conversation prefix by prefix"):
        chat.encode(CONVERSATIONS[1])


def test_chat_tokenizer_stops_at_the_end_of_turn(tok):
    chat = resolve_chat("chatml", tok)
    view = chat_tokenizer(tok, chat)
    assert isinstance(view, ChatTokenizer) and view.eos_id == tok.token_to_id("<|im_end|>") != tok.eos_id
    assert view.bos_id == tok.bos_id and view.encode("ab") == tok.encode("ab") and view.base is tok
    assert chat_tokenizer(tok, None) is tok
    import copy
    import pickle

    for clone in (copy.deepcopy(view), pickle.loads(pickle.dumps(view))):
        assert clone.eos_id == view.eos_id and clone.encode("ab") == tok.encode("ab")


def test_saved_template_is_found_by_the_next_stage(tmp_path, tok, tok_dir):
    for spec in ("chatml", "auto"):
        view = chat_tokenizer(tok, resolve_chat(spec, tok, [tok_dir]))
        d = tmp_path / spec
        d.mkdir()
        view.save(d / "tokenizer.json")
        again = resolve_chat("auto", load(d / "tokenizer.json"), [d])
        assert again.render(CONVERSATIONS[1]) == resolve_chat(spec, tok, [tok_dir]).render(CONVERSATIONS[1])
        assert (again.name == "chatml") == (spec == "chatml")  # the built-in is recognised by its saved source
