"""Chat templates: a conversation ``[{role, content}, ...]`` -> the text a model sees, and which of its tokens
are the assistant's (the SFT loss mask).

Key insight: the assistant mask comes from rendering *prefix by prefix*, never from guessing at the
template's markers. For assistant message k of a conversation m:

    head_k = render(m[:k], add_generation_prompt=True)      # everything up to where the reply starts
    turn_k = render(m[:k+1])                                # ... up to the end of the reply
    span_k = [len(head_k), len(turn_k.rstrip()))            # the reply's content and its end marker

Both must be prefixes of ``render(m)`` (a template that rewrites earlier turns, e.g. drops their reasoning,
is refused with a clear error). The text is then encoded piece by piece, cut at the span boundaries, so
every token is wholly inside or outside a span: the masked tokens decode to exactly the assistant
contents and their end markers (``<|im_end|>``). Pieces are encoded on their own, as posttrain's SFT
always encoded prompt and answer apart; the boundaries sit at the turn markers, where a tokenizer does not
merge anyway. A template with no end marker gets the tokenizer's EOS after each reply instead.

Templates (``--chat-template``):

    auto       (default) the tokenizer's own template, for conversation data only; plain-string
               prompts/completions are used as they are (TRL's "standard" format)
    tokenizer  the tokenizer's own template for everything: a string prompt is one user turn
    chatml     the built-in ChatML (``<|im_start|>role\\n...<|im_end|>\\n``), for everything
    none       no template: conversation data is an error
    FILE       a Jinja template file (``.jinja``, or a ``tokenizer_config.json`` holding one), for everything

"The tokenizer's own" is its ``chat_template`` attribute (a transformers tokenizer), else
``chat_template.jinja`` or the ``chat_template`` of ``tokenizer_config.json`` in the model/checkpoint
directory. Jinja templates are rendered by transformers (``apply_chat_template`` on a transformers
tokenizer, else its ``render_jinja_template``), so they behave exactly as in transformers and vLLM.

A rendered text never starts with the BOS token's text: posttrain adds BOS as an id (``encode_prompt``),
so a template that writes ``{{ bos_token }}`` does not give two. With a template, generation stops at the
template's end-of-turn token (:func:`chat_tokenizer`: the tokenizer seen through a view whose ``eos_id``
is that token), the token SFT trained the model to emit; that view also saves the template as
``chat_template.jinja`` beside the tokenizer in every checkpoint, where the next stage (and transformers) find it.

A template is untrusted code (it comes with a model): each rendering runs under a budget (:func:`render_budget`):
all its ``range()`` calls together may produce :data:`RANGE_ITEMS` items, the rendered text may be
:data:`OUTPUT_CHARS` characters plus 4 per character of the conversation, and on the main thread it may take
:data:`RENDER_SECONDS` of wall-clock time; past any of them the conversation fails with one line
(``chat template T exceeded its rendering budget: ...``). Jinja's sandbox (transformers') already refuses
attribute tricks and a single ``range`` over 100,000 items; the budget adds the nested loop it lets through.

Not handled: tools, documents and multimodal content (only text parts are kept), ``continue_final_message``;
a single huge allocation inside one template expression (e.g. ``'x' * 10**10``) is not interrupted midway.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import signal
import threading
from collections.abc import Sequence
from pathlib import Path

from posttrain.errors import ConfigError, DataError, UserError

ROLES = ("system", "user", "assistant")
BUILTIN_TEMPLATES = ("chatml",)
TEMPLATE_MODES = ("auto", "tokenizer", "none") + BUILTIN_TEMPLATES
_PROBE = "posttrain chat probe 7"


# ------------------------------------------------------------------------------------------ messages


def is_conversation(x) -> bool:
    """A list (of messages): what a conversational field holds, as opposed to a plain string."""
    return isinstance(x, list)


def _text_content(c, where: str):
    if isinstance(c, str):
        return c, None
    if isinstance(c, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in c
    ):
        return "".join(p["text"] for p in c), None  # text parts, as the OpenAI format writes them
    return None, f"{where}: 'content' must be a string, got {type(c).__name__}"


def check_messages(msgs, field: str = "messages", *, need_assistant: bool = False, last: str | None = None):
    """(messages with string contents, None) or (None, why the value is not a usable conversation).

    A conversation is a non-empty list of objects with a ``role`` in system/user/assistant and a string
    ``content`` (or a list of text parts). ``need_assistant``: at least one assistant message (SFT);
    ``last``: the role the last message must have (a reply: "assistant").
    """
    if not isinstance(msgs, list):
        return None, f"field {field!r} must be a list of messages, got {type(msgs).__name__}"
    if not msgs:
        return None, f"field {field!r} is an empty conversation"
    out = []
    for j, m in enumerate(msgs):
        where = f"{field}[{j}]"
        if not isinstance(m, dict):
            return None, f"{where} must be an object with 'role' and 'content', got {type(m).__name__}"
        for key in ("role", "content"):
            if key not in m:
                return None, f"{where} has no {key!r}"
        if m["role"] not in ROLES:
            return None, f"{where}: role {m['role']!r} is not one of {', '.join(ROLES)}"
        content, reason = _text_content(m["content"], where)
        if reason is not None:
            return None, reason
        out.append({**m, "content": content})
    if need_assistant and not any(m["role"] == "assistant" for m in out):
        return None, f"field {field!r} has no assistant message (nothing to train on)"
    if last is not None and out[-1]["role"] != last:
        return None, f"field {field!r}: the last message must be the {last}'s, got {out[-1]['role']!r}"
    return out, None


# ------------------------------------------------------------------------------------------ templates


CHATML_JINJA = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)
"""ChatML as the Jinja source saved beside a checkpoint's tokenizer (transformers and vLLM render it alike)."""


class ChatML:
    """The built-in ChatML template (Qwen's): ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, and
    ``<|im_start|>assistant\\n`` as the generation prompt. Needs ``<|im_start|>``/``<|im_end|>`` tokens."""

    name = "chatml"
    special_tokens = ("<|im_start|>", "<|im_end|>")
    source = CHATML_JINJA

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


RANGE_ITEMS = 1_000_000  # items all range() calls of one rendering may produce together
OUTPUT_CHARS = 1_000_000  # rendered characters allowed beyond 4 per character of the conversation
RENDER_SECONDS = 5.0  # wall-clock time of one rendering (main thread only: it uses SIGALRM)
_range_left: contextvars.ContextVar[list | None] = contextvars.ContextVar("chat_range_left", default=None)


class RenderBudgetExceeded(Exception):
    """A chat template went past :func:`render_budget` (the message says which limit)."""


def _budget_range(*args):
    """The sandbox's ``range`` (one call <= 100,000 items), counted against the rendering's :data:`RANGE_ITEMS`."""
    from jinja2.sandbox import safe_range

    rng = safe_range(*args)
    left = _range_left.get()
    if left is not None:
        left[0] -= len(rng)
        if left[0] < 0:
            raise RenderBudgetExceeded(f"its range() calls produce more than {RANGE_ITEMS:,} items")
    return rng


def _install_budget_range(source: str) -> None:
    """Put :func:`_budget_range` in the environment transformers compiles (and caches) ``source`` in; a
    transformers without that helper keeps the sandbox's own range (the time and size limits still apply)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return
    _compile_jinja_template(source).environment.globals["range"] = _budget_range


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise :class:`RenderBudgetExceeded` in the block after ``seconds`` (main thread, no other SIGALRM user)."""
    usable = (
        hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
    )
    if not usable:
        yield
        return

    def on_alarm(signum, frame):
        raise RenderBudgetExceeded(f"rendering took more than {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def render_budget():
    """Limit one rendering: :data:`RANGE_ITEMS` range items in all, :data:`RENDER_SECONDS` of time."""
    token = _range_left.set([RANGE_ITEMS])
    try:
        with _deadline(RENDER_SECONDS):
            yield
    finally:
        _range_left.reset(token)


def _conversation_chars(messages) -> int:
    return sum(len(str(m.get("content", ""))) + len(str(m.get("role", ""))) for m in messages)


class JinjaTemplate:
    """A Jinja chat template rendered by transformers (the tokenizer's ``apply_chat_template`` when given a
    transformers tokenizer, else ``render_jinja_template`` with its bos/eos token strings)."""

    def __init__(self, source: str, name: str, hf_tokenizer=None, special: dict | None = None):
        self.source, self.name, self.hf, self.special = source, name, hf_tokenizer, dict(special or {})
        self.special_tokens = ()

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
        msgs = [dict(m) for m in messages]
        try:
            with render_budget():
                text = self._render(msgs, add_generation_prompt)
        except RenderBudgetExceeded as e:
            raise DataError(
                f"chat template {self.name} exceeded its rendering budget on this conversation: {e}"
            ) from None
        limit = OUTPUT_CHARS + 4 * _conversation_chars(msgs)
        if len(text) > limit:
            raise DataError(
                f"chat template {self.name} exceeded its rendering budget on this conversation: it rendered "
                f"{len(text):,} characters (at most {limit:,} for this conversation)"
            )
        return text

    def _render(self, msgs: list[dict], add_generation_prompt: bool) -> str:
        try:
            _install_budget_range(self.source)  # a syntax error in the template surfaces here: one line below
            if self.hf is not None:
                return self.hf.apply_chat_template(
                    msgs, chat_template=self.source, tokenize=False, add_generation_prompt=add_generation_prompt
                )
            try:
                from transformers.utils.chat_template_utils import render_jinja_template
            except ImportError:
                raise UserError(
                    "Jinja chat templates are rendered by transformers: pip install 'posttrain[hf]' "
                    "(or use --chat-template chatml)"
                ) from None
            texts, _ = render_jinja_template(
                [msgs], chat_template=self.source, add_generation_prompt=add_generation_prompt, **self.special
            )
            return texts[0]
        except (UserError, RenderBudgetExceeded):
            raise
        except Exception as e:  # noqa: BLE001 - a template's own error ("raise_exception", a jinja syntax error)
            raise DataError(
                f"chat template {self.name} failed on this conversation: {type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}"
            ) from None


def _token_text(tok, idx) -> str | None:
    if idx is None:
        return None
    fn = getattr(tok, "id_to_token", None) or getattr(tok, "convert_ids_to_tokens", None)
    return fn(int(idx)) if fn is not None else None


def template_in_dir(d: str | Path) -> tuple[str, str] | None:
    """(template source, where it came from) of a model/checkpoint directory, or None: ``chat_template.jinja``
    first (what transformers >= 4.43 saves), else ``tokenizer_config.json``'s ``chat_template``."""
    d = Path(d)
    if (d / "chat_template.jinja").is_file():
        return (d / "chat_template.jinja").read_text(encoding="utf-8"), str(d / "chat_template.jinja")
    cfg = d / "tokenizer_config.json"
    if cfg.is_file():
        return _template_from_config(cfg)
    return None


def _template_from_config(path: Path) -> tuple[str, str] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    t = data.get("chat_template") if isinstance(data, dict) else None
    if isinstance(t, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
    return (t, str(path)) if isinstance(t, str) and t.strip() else None


def _own_template(tokenizer, dirs: Sequence) -> tuple[str, str, object] | None:
    """(source, name, transformers tokenizer or None) of the tokenizer's own template, or None."""
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str) and own.strip():
        hf = tokenizer if hasattr(tokenizer, "apply_chat_template") else None
        return own, "of the tokenizer", hf
    for d in dirs:
        if d is not None and Path(d).is_dir() and (found := template_in_dir(d)) is not None:
            return found[0], found[1], None
    return None


class Chat:
    """A template bound to a tokenizer: renders prompts and completions, and encodes conversations with
    their assistant mask (see the module docstring). ``wrap_strings``: a string prompt is one user turn
    and a string completion one assistant turn (every mode but ``auto``)."""

    def __init__(self, template, tokenizer, wrap_strings: bool):
        self.template, self.tok, self.wrap_strings = template, tokenizer, wrap_strings
        self.bos_text = _token_text(tokenizer, getattr(tokenizer, "bos_id", None))
        self.end_marker, self.stop_id = self._end_marker()

    @property
    def name(self) -> str:
        return self.template.name

    def render(self, messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
        text = self.template.render(messages, add_generation_prompt)
        if self.bos_text and text.startswith(self.bos_text):  # BOS is added as an id, never as text
            text = text[len(self.bos_text) :]
        return text

    def _end_marker(self) -> tuple[str, int | None]:
        """The text a reply ends with (``<|im_end|>``) and its token id when it is a single token."""
        msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}]
        head, turn = self.render(msgs[:1], True), self.render(msgs)
        tail = turn[len(head) :].rstrip() if turn.startswith(head) else ""
        marker = tail[len(_PROBE) :] if tail.startswith(_PROBE) else ""
        for t in getattr(self.template, "special_tokens", ()):
            if getattr(self.tok, "token_to_id", lambda _: 0)(t) is None:
                raise ConfigError(
                    f"--chat-template {self.name} needs the token {t!r}, which the tokenizer does not "
                    f"have (train one with --special-tokens ... {' '.join(self.template.special_tokens)})"
                )
        ids = list(self.tok.encode(marker)) if marker.strip() else []
        return marker.strip() and marker, (ids[0] if len(ids) == 1 else None)

    # -- prompts and completions (RL, preference pairs, evaluation) -------------------------------------
    def as_messages(self, x, role: str) -> list[dict]:
        return x if is_conversation(x) else [{"role": role, "content": x}]

    def prompt_text(self, prompt) -> str:
        """The generation prompt: a conversation (or, wrapping strings, a user turn) rendered with the
        generation prompt added; a string as it is otherwise."""
        if isinstance(prompt, str) and not self.wrap_strings:
            return prompt
        return self.render(self.as_messages(prompt, "user"), add_generation_prompt=True)

    def completion_text(self, prompt, completion) -> str:
        """The text of a reply after :meth:`prompt_text` of ``prompt``; its final end marker is dropped when it
        is the stop token (the encoders append EOS, which :func:`chat_tokenizer` makes that token)."""
        if isinstance(completion, str) and isinstance(prompt, str) and not self.wrap_strings:
            return completion
        p = self.as_messages(prompt, "user")
        head = self.render(p, add_generation_prompt=True)
        full = self.render(p + self.as_messages(completion, "assistant"))
        if not full.startswith(head):
            raise DataError(
                f"the chat template {self.name} does not render the prompt as a prefix of prompt + "
                f"completion, so the completion cannot be cut out; use --chat-template chatml"
            )
        text = full[len(head) :].rstrip()
        if self.stop_id is not None and self.end_marker and text.endswith(self.end_marker):
            text = text[: len(text) - len(self.end_marker)]
        return text

    # -- conversations with a loss mask (SFT) -------------------------------------------------------------
    def spans(self, msgs: Sequence[dict]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character span of each assistant reply (content + end marker)."""
        full = self.render(msgs)
        spans = []
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            head, turn = self.render(msgs[:k], add_generation_prompt=True), self.render(msgs[: k + 1])
            if not (full.startswith(head) and full.startswith(turn) and turn.startswith(head)):
                raise DataError(
                    f"the chat template {self.name} does not render this conversation prefix by prefix "
                    f"(it rewrites earlier turns), so the assistant tokens cannot be found; use "
                    f"--chat-template chatml or a template that does not"
                )
            a = len(head)
            spans.append((a, a + len(turn[a:].rstrip())))
        return full, spans

    def encode(self, msgs: Sequence[dict], train_from: int = 0) -> tuple[list[int], list[int]]:
        """Token ids of a conversation ([BOS] + its pieces) and the loss mask: 1 on assistant tokens (each
        reply's content and end marker; EOS after a reply when the template has no marker), 0 elsewhere.
        Replies before message ``train_from`` are context (mask 0: a prompt-completion record trains only
        its completion). Text after the last reply is not included (nothing to learn from it)."""
        full, spans = self.spans(msgs)
        trained = [k >= train_from for k, m in enumerate(msgs) if m["role"] == "assistant"]
        bos = getattr(self.tok, "bos_id", None)
        ids, mask = ([int(bos)], [0]) if bos is not None else ([], [])
        pos = 0
        for (a, b), train in zip(spans, trained):
            for text, m in ((full[pos:a], 0), (full[a:b], int(train))):
                piece = list(self.tok.encode(text)) if text else []
                ids += piece
                mask += [m] * len(piece)
            if not self.end_marker and getattr(self.tok, "eos_id", None) is not None:
                ids.append(int(self.tok.eos_id))
                mask.append(int(train))
            pos = b
        return ids, mask


def resolve_chat(spec: str | None, tokenizer, dirs: Sequence = ()) -> Chat | None:
    """The chat template ``--chat-template spec`` names for ``tokenizer`` (see the module docstring); None
    when there is none (``none``, or ``auto`` with a tokenizer without one). ``dirs``: the model or
    checkpoint directories to look for the tokenizer's own template in."""
    spec = "auto" if spec is None else str(spec)
    if spec == "none":
        return None
    if spec == "chatml":
        return Chat(ChatML(), tokenizer, wrap_strings=True)
    if spec in ("auto", "tokenizer"):
        own = _own_template(tokenizer, dirs)
        if own is None:
            if spec == "tokenizer":
                raise ConfigError(
                    "--chat-template tokenizer: the tokenizer has no chat template (no chat_template in "
                    "its tokenizer_config.json, no chat_template.jinja); pass --chat-template chatml or "
                    "a .jinja file"
                )
            return None
        source, where, hf = own
        template = (
            ChatML() if source == CHATML_JINJA else JinjaTemplate(source, f"({where})", hf, _special_strings(tokenizer))
        )
        return Chat(template, tokenizer, wrap_strings=spec == "tokenizer")
    p = Path(spec)
    if not p.is_file():
        raise ConfigError(f"--chat-template {spec!r}: not one of {', '.join(TEMPLATE_MODES)} and not a file")
    found = _template_from_config(p) if p.suffix == ".json" else (p.read_text(encoding="utf-8"), str(p))
    if found is None:
        raise ConfigError(f"--chat-template {spec}: the file holds no chat_template")
    return Chat(JinjaTemplate(found[0], found[1], None, _special_strings(tokenizer)), tokenizer, wrap_strings=True)


def _special_strings(tokenizer) -> dict:
    out = {}
    for name in ("bos", "eos", "pad", "unk"):
        t = _token_text(tokenizer, getattr(tokenizer, f"{name}_id", None))
        if t is not None:
            out[f"{name}_token"] = t
    return out


class ChatTokenizer:
    """A tokenizer seen with the chat template's end-of-turn token as its EOS (everything else delegated), so
    sampling stops where a reply ends and the EOS appended to completions is that token. ``save`` also writes
    the template as ``chat_template.jinja`` beside the tokenizer file: every checkpoint carries it, and the next
    stage's ``--chat-template auto`` (and transformers) find it there."""

    def __init__(self, tokenizer, chat: Chat):
        self._tok, self._chat = tokenizer, chat
        self._stop = chat.stop_id if chat.stop_id is not None else getattr(tokenizer, "eos_id", None)

    @property
    def eos_id(self):
        return self._stop

    @property
    def base(self):
        return self._tok

    def save(self, path) -> None:
        self._tok.save(path)
        source = getattr(self._chat.template, "source", None)
        if source:
            (Path(path).parent / "chat_template.jinja").write_text(source, encoding="utf-8")

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_tok", "_chat", "_stop"):  # copy/pickle probe before __init__ ran
            raise AttributeError(name)
        return getattr(self._tok, name)


def chat_tokenizer(tokenizer, chat: Chat | None):
    """``tokenizer`` without a template; with one, a :class:`ChatTokenizer` view (EOS = the end-of-turn token
    when that is one token; the template saved with the tokenizer)."""
    return tokenizer if chat is None else ChatTokenizer(tokenizer, chat)
