"""Regimes and arms by name: every headline cell composes as `regime=R arm=A seed=N`, and what it composes is what its
committed runs trained (the keys that decide training: model, data, optim, mitigation, steps, seed).

The reference is independent of conf/regime and conf/arm: each committed run's own command (its comparison.csv
row), composed the way it was run then, with the presets of that time (conf/experiment/*.yaml and `+recipe=learned`
at aeccd85, copied below as the overrides they were) in the order Hydra merged them (experiment, then recipe, then
the rest of the command)."""
from __future__ import annotations

import csv
import shlex

import pytest

from phasefix.decisive import arm_name
from phasefix.fit import compose
from phasefix.paths import PROJECT_ROOT
from phasefix.study.cells import cells, committed_runs, identity, load_comparison

# conf/experiment/<name>.yaml and conf/recipe/learned.yaml as they were when the committed runs trained
OLD_PRESETS = {
    "+experiment=coverage_w8s8": [
        "model.window=8", "model.stride=8", "model.num_heads=2", "model.num_kv_heads=2", "model.head_dim=64",
        "model.local_memory=window", "model.local_window=16", "model.payload_init=shared", "model.vocab_size=160",
        "data.num_records=32", "data.num_keys=64", "data.num_values=64", "data.in_sequence_prob=0.0",
        "data.max_prefix_pad=47", "optim.min_lr_ratio=1.0", "trainer.max_steps=3000", "trainer.val_every_n_steps=500"],
    "+experiment=in_sequence": ["model.window=8", "model.stride=8", "data.in_sequence_prob=1.0",
                                "eval.paddings=[in_sequence,prefix]"],
    "+experiment=lm_mix_w4s4": ["data=lm_mix", "model.vocab_size=384"],
    "+experiment=records64": [
        "model.window=8", "model.stride=8", "model.vocab_size=160", "data.num_records=64", "data.num_keys=64",
        "data.num_values=64", "data.num_demos=48", "data.max_prefix_pad=23", "trainer.max_steps=1200"],
    "+recipe=learned": [
        "optim.lr=0.0012221634728708944", "optim.warmup_steps=200", "optim.min_lr_ratio=1.0",
        "optim.weight_decay=0.01", "trainer.batch_size=64", "model.payload_init=shared", "model.gate_init_std=0.02"],
}
HOW_IT_RAN = ("trainer.num_threads", "trainer.progress_bar", "logger.", "+logger.", "run_name", "output_dir",
              "eval.paddings")  # how a run was run and logged, not what it trained


def old_overrides(command: str) -> list[str]:
    """A committed run's command as overrides of today's plain config (no regime, recipe or arm), the presets of
    its time expanded in place."""
    words = shlex.split(command)[3:]  # after `python -m phasefix.fit`
    out = []
    for w in words:
        if w in OLD_PRESETS:
            out += OLD_PRESETS[w]
        elif not w.lstrip("+").startswith(HOW_IT_RAN):
            out.append(w)
    return out


def committed_commands() -> dict[tuple[str, str, int], str]:
    """(regime, arm, seed) -> the command of the fit run the headline's committed tables hold for that cell."""
    headline = load_comparison(PROJECT_ROOT / "comparisons/headline.yaml")
    commands = {}
    for r in headline.regimes:
        for table in r.tables:
            with open(PROJECT_ROOT / table / "comparison.csv", newline="") as f:
                by_id = {row["run_id"]: row["command"] for row in csv.DictReader(f)}
            for run in committed_runs(table):
                if run["regime"] == r.name and by_id.get(run["run_id"]):
                    commands.setdefault((r.name, run["arm"], run["seed"]), by_id[run["run_id"]])
    return commands


COMMANDS = committed_commands()
HEADLINE = cells(load_comparison(PROJECT_ROOT / "comparisons/headline.yaml"))


def test_every_headline_cell_has_a_committed_run():
    missing = [c.name for c in HEADLINE if (c.regime, c.arm, c.seed) not in COMMANDS]
    assert not missing and len(HEADLINE) == 54


@pytest.mark.parametrize("cell", HEADLINE, ids=lambda c: c.name)
def test_headline_cell_composes_what_its_committed_run_trained(cell):
    command = COMMANDS[(cell.regime, cell.arm, cell.seed)]
    by_name = compose(cell.overrides())
    then = compose(old_overrides(command))
    assert by_name.regime == cell.regime and by_name.arm == cell.arm  # recorded from Hydra's choices
    assert identity(by_name) == identity(then)
    assert identity(by_name)["trainer.max_steps"] == str(then.trainer.max_steps)


def test_old_arm_codes_map_to_arms():
    assert arm_name("t5") == arm_name("w5_gd_spread") == "bridge_gate_diversity"
    assert (arm_name("w9_spread"), arm_name("w9_ts2_spread"), arm_name("w9_ts2_spread_hd64")) == (
        "bridge", "bridge_shift", "bridge_shift_wide")


def test_the_bridge_follows_the_regime_stride():
    assert compose(["regime=w8s8", "arm=bridge"]).model.window == 9
    assert compose(["regime=w4s4", "arm=bridge"]).model.window == 5
    assert compose(["arm=bridge", "model.stride=12"]).model.window == 13  # the command line's stride too
    assert compose(["regime=w8s8"]).model.window == 8


def test_layering_is_regime_recipe_arm_then_command_line():
    from phasefix.cli import layering_note

    # overlap_w5s4 pins payload_init=independent; the learned recipe comes after it, so its `shared` wins
    cfg = compose(["regime=overlap_w5s4", "recipe=learned"])
    assert cfg.model.payload_init == "shared"
    assert "set by both regime=overlap_w5s4 and recipe=learned, recipe's value used: model.payload_init" in \
        layering_note(cfg)
    assert compose(["regime=overlap_w5s4", "recipe=learned", "model.payload_init=independent"]).model.payload_init \
        == "independent"
    both = layering_note(compose(["regime=coverage_w8s8", "arm=bridge_shift_wide"]))
    assert "set by both regime=coverage_w8s8 and arm=bridge_shift_wide, arm's value used: model.head_dim" in both
    # records64_inseqfirst is records64 with the inseqfirst recipe (8 demonstrations) over it, then its own 48: a
    # derived regime's own keys win over its recipe, and the note says so
    cfg = compose(["regime=records64_inseqfirst"])
    assert cfg.recipe == "inseqfirst" and cfg.data.num_demos == 48 and cfg.data.in_sequence_from_step == 1200
    assert "set by both regime=records64_inseqfirst and recipe=inseqfirst, regime's value used: data.num_demos" in \
        layering_note(cfg)


@pytest.fixture
def probe_configs():
    """A recipe, a regime that picks it and a regime composed on that one, laid out as conf/regime/*.yaml lay
    theirs out (`_self_`, then `/recipe: NAME`; a derived regime: its parent, then `_self_`), registered in Hydra's
    ConfigStore for this test only."""
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    before = {g: set(repo.get(g, {})) for g in ("regime", "recipe")}
    store = ConfigStore.instance().store
    store(group="recipe", name="probe_recipe", package="_global_",
          node={"optim": {"lr": 0.25, "warmup_steps": 7}, "model": {"payload_init": "shared"}})
    store(group="regime", name="probe_regime", package="_global_",
          node={"defaults": ["_self_", {"/recipe": "probe_recipe"}],
                "optim": {"lr": 0.1, "weight_decay": 0.3}, "model": {"payload_init": "independent"}})
    store(group="regime", name="probe_child", package="_global_",
          node={"defaults": ["probe_regime", "_self_"], "optim": {"lr": 0.5}})
    yield
    for group, names in before.items():
        for name in set(repo.get(group, {})) - names:
            del repo[group][name]
        if not repo.get(group, True):
            del repo[group]


def test_a_regimes_recipe_wins_the_keys_both_set_and_a_derived_regime_wins_over_its_parents_recipe(probe_configs):
    """The one rule (docs/fit.md, "Which layer wins a key"; conf/fit.yaml): later in the defaults list wins. A regime
    lists its own keys, then its recipe: the recipe's value of a key both set is used. A regime composed on another
    comes after that regime and its recipe: its own value is used. `recipe=` on the command line replaces the
    regime's pick; the command line's keys win over all. Expected values written by hand from the probe files."""
    regime = compose(["regime=probe_regime"])
    assert (regime.regime, regime.recipe) == ("probe_regime", "probe_recipe")
    assert (regime.optim.lr, regime.model.payload_init) == (0.25, "shared")  # both set: the recipe's
    assert (regime.optim.weight_decay, regime.optim.warmup_steps) == (0.3, 7)  # one sets: its own
    child = compose(["regime=probe_child"])
    assert (child.recipe, child.optim.lr, child.model.payload_init) == ("probe_recipe", 0.5, "shared")
    plain = compose(["regime=probe_regime", "recipe=none"])
    assert (plain.optim.lr, plain.model.payload_init, plain.optim.warmup_steps) == (0.1, "independent", 200)
    assert compose(["regime=probe_child", "optim.lr=0.9"]).optim.lr == 0.9


def test_run_name_and_tags_come_from_the_choices():
    from phasefix.fit import run_name

    assert run_name(compose(["regime=coverage_w8s8", "arm=bridge", "seed=1"])) == "coverage_w8s8-bridge-s1"
    assert run_name(compose([])) == "tiny-W4S4"  # the default regime and arm: the name it always had
    assert run_name(compose(["arm=spread", "run_name=mine"])) == "mine"


def test_arms_with_a_gate_term_compose_as_the_lead_ran_them():
    """issue 54's first runs were typed by hand (`+mitigation=gate_diversity` with its defaults): the arm composes
    the same, so a comparison finds them."""
    base = ["regime=w4s4_inseqfirst", "seed=3"]
    typed = ["recipe=learned", "data.num_demos=8", "data.in_sequence_prob_before=1.0",
             "data.in_sequence_from_step=1200", "trainer.max_steps=2400", "model.stride=4", "model.window=4",
             "seed=3"]
    for arm, extra in [("shift_spread_head_coord", ["model.token_shift=2", "model.head_offsets=spread",
                                                    "+mitigation=head_coord"]),
                       ("gate_diversity", ["+mitigation=gate_diversity"])]:
        assert identity(compose([*base, f"arm={arm}"])) == identity(compose([*typed, *extra]))


def test_the_coverage_arms_add_a_training_term_to_shift_spread_and_nothing_else():
    """issue 70's arms are shift_spread plus a loss term: the same model (so the same cache entries, bytes and
    multiply-adds) and the term's options as each arm's file says."""
    from phasefix.fit import plan_model

    base = ["regime=coverage_w8s8_curric"]
    plain = compose([*base, "arm=shift_spread"])
    model, mitigations = plan_model(plain)
    assert mitigations == []
    for arm, name, options in [("shift_spread_slot_coverage", "slot_coverage", {}),
                               ("shift_spread_late_slot_coverage", "slot_coverage",
                                {"start_step": 1000, "ramp_steps": 500}),
                               ("shift_spread_head_coord_w01", "head_coord", {"weight": 0.1})]:
        cfg = compose([*base, f"arm={arm}"])
        assert cfg.model == plain.model and cfg.arm == arm
        typed = compose([*base, "arm=shift_spread", f"+mitigation={name}",
                         *(f"mitigation.{name}.{k}={v}" for k, v in options.items())])
        assert cfg.mitigation == typed.mitigation
        got_model, (m,) = plan_model(cfg)
        assert got_model == model and m.name == name
        assert got_model.cache_entries_per_token() == model.cache_entries_per_token()
        assert got_model.compressor_flops_per_token() == model.compressor_flops_per_token()


def test_the_entry_dropout_arm_is_late_gate_diversity_plus_entry_dropout_on_the_same_model():
    from phasefix.fit import plan_model

    base = ["regime=coverage_w8s8_curric"]
    late = compose([*base, "arm=shift_spread_late_gate_diversity"])
    cfg = compose([*base, "arm=shift_spread_late_gate_diversity_entry_dropout"])
    typed = compose([*base, "arm=shift_spread", "+mitigation=[gate_diversity,entry_dropout]",
                     "mitigation.gate_diversity.start_step=1000", "mitigation.gate_diversity.ramp_steps=500",
                     "mitigation.entry_dropout.start_step=1000"])
    assert cfg.model == late.model and cfg.mitigation == typed.mitigation
    model, (gate_diversity, entry_dropout) = plan_model(cfg)
    assert model == plan_model(late)[0]
    assert (gate_diversity.start_step, entry_dropout.p, entry_dropout.start_step) == (1000, 0.5, 1000)


def test_the_in_sequence_first_recipe_is_what_stride_inseqfirst_trained():
    """recipe=inseqfirst at 2,400 steps composes the runs of docs/figures/stride_inseqfirst (their command: the
    learned recipe, 8 demonstrations, in-sequence only before step 1,200); its switch follows the budget."""
    with open(PROJECT_ROOT / "docs/figures/stride_inseqfirst/comparison.csv", newline="") as f:
        command = next(r["command"] for r in csv.DictReader(f) if "model.stride=6 " in r["command"])
    recipe = compose(["recipe=inseqfirst", "model.stride=6", "trainer.max_steps=2400", "seed=0"])
    assert identity(recipe) == identity(compose(old_overrides(command)))
    assert compose(["recipe=inseqfirst", "trainer=fast"]).data.in_sequence_from_step == 12


def test_the_old_experiment_group_says_where_its_presets_went():
    from phasefix.errors import ConfigError

    with pytest.raises(ConfigError, match=r"experiment=records64 is invalid: the presets are regimes now, "
                                          r"regime=NAME \(no \+\): allowed values are .*records64"):
        compose(["+experiment=records64"])
