"""The results page's costs against hand-computed ones (phasefix.results)."""
from phasefix.results import arm_overrides, cache_bytes


def test_costs_of_the_w4s4_winner_by_hand():
    # tiny: 2 layers, 2 KV heads of dim 32, W4/S4 -> bridge W5/S4; an entry is a key and a value vector in bf16
    assert cache_bytes("w4s4", "baseline") == 2 * 2 / 4 * 2 * 32 * 2 == 128
    assert cache_bytes("w4s4", "bridge_gate_diversity") == 128  # the bridge writes as many entries
    assert cache_bytes("records64", "bridge_shift_wide") == 2 * 2 / 8 * 2 * 64 * 2 == 128  # 64-dim heads, S = 8
    assert cache_bytes("records64", "baseline") == 64


def test_the_arm_legend_reads_conf_arm():
    assert arm_overrides("bridge") == "model.window=S+1 model.head_offsets=spread"
    assert arm_overrides("baseline").startswith("(nothing")
    assert arm_overrides("shift_spread_head_coord") == \
        "+mitigation=head_coord model.token_shift=2 model.head_offsets=spread"
