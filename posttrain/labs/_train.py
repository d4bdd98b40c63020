"""Shared pieces of the training labs: a quick SFT init on the embedded task, quiet trainer runs, metrics.

Every run is tiny (a 1-layer GPT on 1-digit addition, tens of steps) so a lab stays under a minute on two
cores; trainers are called through their public API (``train_sft``, ``train_dpo``, ``train_policy_gradient``)
with ``progress=False`` and their console lines captured, so a lab prints only its own findings.

Device and precision: ``posttrain lab --device D --dtype T`` (a :class:`DeviceConfig`, set by ``run_lab`` for the
lab's run: :func:`on_device`) reach every trainer a lab runs through :func:`quiet`; the labs' own measurements on
the trained checkpoints (log-probs, samples) stay on the CPU in fp32.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import tempfile
from pathlib import Path

from posttrain.models.gpt import GPTConfig
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.trainers.device_config import DeviceConfig

TASK = ArithmeticConfig(digits=1, num_demos=60, num_eval=12)
MODEL = GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24)
DEVICE: DeviceConfig | None = None  # the device and dtype of the lab being run; None: each trainer's defaults


@contextlib.contextmanager
def on_device(device: DeviceConfig | None):
    """Run the trainers of the enclosed lab with ``device``'s device and dtype (None: their defaults)."""
    global DEVICE
    before, DEVICE = DEVICE, device
    try:
        yield
    finally:
        DEVICE = before


def device_key() -> tuple | None:
    """What the lab's trainers run on, for the keys of results reused within a process: (device, dtype) or None."""
    return None if DEVICE is None else (DEVICE.device, DEVICE.dtype)


def quiet(fn, cfg, **kwargs):
    """Call trainer ``fn`` on ``cfg`` (given the lab run's device and dtype) with its standard output and error
    captured (returned as the second value)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        out = fn(cfg if DEVICE is None else DEVICE.apply(cfg), **kwargs)
    return out, buf.getvalue()


_CACHE: dict = {}


def sft_init(steps: int, seed: int = 0) -> str:
    """A quick SFT checkpoint (run directory) on the embedded task, trained once per process for each
    (steps, seed) and shared by the labs (a temporary directory removed at exit); returns its path."""
    from posttrain.trainers.sft import SFTConfig, train_sft

    key = (steps, seed, device_key())
    if key not in _CACHE:
        if "root" not in _CACHE:
            _CACHE["root"] = tempfile.TemporaryDirectory(prefix="posttrain-labs-")
            atexit.register(_CACHE["root"].cleanup)
        out = Path(_CACHE["root"].name) / "-".join(map(str, ("sft", steps, seed, *(device_key() or ()))))
        quiet(
            train_sft,
            SFTConfig(
                out=str(out),
                steps=steps,
                batch_size=32,
                lr=1e-2,
                warmup_steps=2,
                eval_every=0,
                save_every=0,
                progress=False,
                task=TASK,
                model=MODEL,
                seed=seed,
            ),
        )
        _CACHE[key] = str(out)
    return _CACHE[key]


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def pair_logps(model_dir, pairs) -> tuple:
    """Sequence log-probs (chosen (N,), rejected (N,)) of ``pairs`` (PreferencePair list) under a checkpoint."""
    import torch

    from posttrain.checkpoints.load import load_checkpoint
    from posttrain.data.preference import collate_preference
    from posttrain.trainers.preference_data import seq_logps

    ck = load_checkpoint(model_dir)
    ck.model.eval()
    with torch.no_grad():
        lp, _ = seq_logps(ck.model, collate_preference(pairs, ck.tokenizer))
    n = len(pairs)
    return lp[:n].double(), lp[n:].double()


RECORDED: list[list[str]] = []  # completions of every reward call of the current lab run, in order


def one_digit_reward(prompts, completions, **_):
    """1 for any single-digit answer: ten answers share the top reward (what the entropy lab needs)."""
    RECORDED.append(list(completions))
    return [1.0 if len(c.strip()) == 1 and c.strip().isdigit() else 0.0 for c in completions]


def long_answer_reward(prompts, completions, answer=None, **cols):
    """A flawed 'reward model': exact match plus 0.3 per character, so long wrong answers beat short right ones."""
    from posttrain.rewards.verifiers import exact_match_reward

    em = exact_match_reward(prompts, completions, answer=answer, **cols)
    RECORDED.append(list(zip(completions, em)))
    return [e + 0.3 * len(c.strip()) for e, c in zip(em, completions)]


def register_lab_rewards() -> None:
    """Register the labs' reward functions (idempotent)."""
    from posttrain.rewards.registry import REWARD_FUNCTIONS, register_reward

    for name, fn in (("lab_one_digit", one_digit_reward), ("lab_long_answer", long_answer_reward)):
        if name not in REWARD_FUNCTIONS:
            register_reward(name, _factory(fn))


def _factory(fn):
    return lambda **_: fn


def distinct_per_group(completions: list[str], group: int) -> list[int]:
    return [len(set(completions[i : i + group])) for i in range(0, len(completions), group)]
