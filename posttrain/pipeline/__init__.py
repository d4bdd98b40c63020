"""``posttrain pipeline``: raw corpus -> dedup -> tokenizer -> SFT -> reward model -> DPO / GRPO / PPO -> eval -> report.

One command from raw text to aligned models on the embedded default (or your data, ``--config``), every
stage in its own folder under ``--out``, cached and resumed by content (:mod:`.cache`), ending in
``summary.json`` and ``report/report.html``. Modules: :mod:`.stages` (the declared stages), :mod:`.cache`
(keys, ``DONE.json``), :mod:`.corpus` (the embedded corpus), :mod:`.data_stages` (dedup, tokenizer),
:mod:`.evaluate` (the evaluation stage), :mod:`.report` and :mod:`.plots`, :mod:`.run` (the loop),
:mod:`.config` (the config and the ``tiny`` / ``micro`` presets). docs/pipeline.md describes it all.
"""

from __future__ import annotations


def run_demo(out: str, seed: int = 0, **_ignored) -> dict:
    """The former ``posttrain demo``: the pipeline on the ``tiny`` preset (what ``make demo`` runs)."""
    from posttrain.config import build_config
    from posttrain.pipeline.config import PRESETS, PipelineConfig
    from posttrain.pipeline.run import run_pipeline

    cfg = build_config(PipelineConfig, PRESETS["tiny"], overrides={"seed": seed})
    return run_pipeline(cfg, out, preset="tiny")
