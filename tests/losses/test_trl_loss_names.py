"""Every TRL 1.16 ``DPOConfig.loss_type`` name is accepted as a ``--loss`` and computes what TRL computes.

The oracle is TRL itself: its own list of loss types (read from its ``DPOConfig`` field help, not copied here)
and its ``DPOTrainer._compute_loss`` on a stub model that returns fixed per-token log-probs (the harness of
``test_preference.py``). Names we do not implement are refused with one line naming the closest ones.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from posttrain.errors import ConfigError
from posttrain.losses.preference import LOSS_SPECS, NO_EQUIVALENT, canonical_loss, resolve_loss
from posttrain.trainers.dpo_config import DPOConfig

trl = pytest.importorskip("trl")

_spec = importlib.util.spec_from_file_location("_pref_harness", Path(__file__).with_name("test_preference.py"))
_h = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_h)


def _trl_loss_types() -> list[str]:
    from trl import DPOConfig as TRLDPOConfig

    text = TRLDPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    names = re.findall(r"`'([a-z_]+)'`", text)
    assert len(names) >= 10, text  # the help lists them; a format change should fail here, not pass vacuously
    return names


TRL_NAMES = _trl_loss_types()

# options TRL needs for some losses (exo_pair refuses label_smoothing 0), given to both sides
KW = {"exo_pair": {"label_smoothing": 0.1}, "robust": {"label_smoothing": 0.2}, "aot": {}, "aot_unpaired": {}}
TAU = 0.05  # TRL's discopop_tau default, our discopop's tau default


@pytest.mark.parametrize("trl_name", TRL_NAMES)
def test_every_trl_loss_type_is_accepted(trl_name):
    ours = canonical_loss(trl_name)
    assert ours in LOSS_SPECS
    cfg = DPOConfig(loss=trl_name, init="x")
    assert cfg.loss == ours  # saved under our name
    assert resolve_loss(trl_name).name == ours


@pytest.mark.parametrize("trl_name", [n for n in TRL_NAMES if n != "bco_pair"])
def test_trl_name_computes_what_trl_computes(trl_name):
    # bco_pair keeps a running reward mean across steps (a state TRL keeps on the trainer); its parity is
    # test_preference.py's business
    kw = KW.get(trl_name, {})
    for seed in range(2):
        token_lp, cmask, ref = _h._random_batch(B=6, T=10, seed=seed)
        trl_loss, trl_m = _h._trl_dpo(
            [trl_name], [1.0], 0.1, kw.get("label_smoothing", 0.0), token_lp, cmask, ref, discopop_tau=TAU
        )
        loss, m = _h._ours(trl_name, token_lp, cmask, ref, beta=0.1, **kw)
        assert loss.item() == pytest.approx(trl_loss.item(), abs=1e-6, rel=1e-6), trl_name


def test_combined_trl_names_resolve_to_ours():
    assert resolve_loss("sigmoid,sft", "1,0.5").components == ("dpo", "sft")
    assert canonical_loss("aot_pair") == "aot_unpaired"  # TRL's name for it before 0.20


@pytest.mark.parametrize("name", sorted(NO_EQUIVALENT))
def test_unimplemented_names_are_refused_naming_the_closest(name):
    with pytest.raises(ConfigError) as e:
        resolve_loss(name)
    msg = str(e.value)
    assert "\n" not in msg and "closest" in msg
    assert all(alt in LOSS_SPECS for alt in NO_EQUIVALENT[name])


def test_a_typo_names_the_closest():
    with pytest.raises(ConfigError, match="closest: sigmoid"):
        resolve_loss("sigmod")


def test_default_loss_is_plain_dpo_and_the_embedded_recipe_keeps_rpo():
    from posttrain.trainers.dpo_config import PRESETS

    assert DPOConfig(init="x").loss == "dpo"
    assert PRESETS["tiny"]["loss"] == "rpo"
