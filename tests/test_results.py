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


def test_mechanism_links_one_line_per_regime_in_the_comparisons_order(tmp_path, monkeypatch):
    import re
    from types import SimpleNamespace

    from phasefix import results
    out = tmp_path / "docs" / "figures" / "cmp"
    for cell in ("records64-spread-s0", "records64-baseline-s0", "records64-anchor-s0", "w4s4_inseqfirst-spread-s3"):
        (out / "mechanism" / cell).mkdir(parents=True)
    monkeypatch.setattr(results, "PROJECT_ROOT", tmp_path)
    comp = SimpleNamespace(out=out, regimes=[SimpleNamespace(name="w4s4_inseqfirst"), SimpleNamespace(name="records64")])
    items = [line for line in results.mechanism_links(comp) if line.startswith("- ")]
    assert [re.findall(r"^- (\w+)|`([^`]+)`", line) for line in items] == [
        [("w4s4_inseqfirst", ""), ("", "spread-s3")],
        [("records64", ""), ("", "baseline-s0"), ("", "anchor-s0"), ("", "spread-s0")]]  # the unmitigated run first
    assert "[gates](figures/cmp/mechanism/records64-baseline-s0/gates.png)" in items[1]
    assert results.mechanism_links(SimpleNamespace(out=tmp_path / "docs" / "none", regimes=[])) == []
