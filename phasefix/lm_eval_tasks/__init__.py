"""lm-evaluation-harness tasks `phasefix_kv_lookup` and `phasefix_needle`: the phase-controlled prompts of
`phasefix.evaluate` (`phasefix.data.text_prompts`), answered by any backend the harness supports, scored per residue.

    lm_eval --include_path "$(python -c 'import phasefix.lm_eval_tasks as t; print(t.INCLUDE_PATH)')" \\
        --tasks phasefix_kv_lookup --model hf --model_args pretrained=/models/Qwen3-0.6B --batch_size 8 \\
        --metadata '{"period": 24, "per_residue": 8, "phase_of": "fact"}'

The rule is `phasefix.evaluate score=exact`'s (greedy, as many tokens as the answer has, exact text match), and the
metrics `r00` .. `r23` are the accuracy of each residue (of the target key's position, or of the prompt's length
with phase_of=end), `exact_match` the mean over prompts: with the same model, prompts and rule they equal
`phasefix.evaluate`'s `per_residue` (tests/test_lm_eval_tasks.py). The tokenizer comes from `--model_args`
(`tokenizer=`, else `pretrained=` or `model=`) or `--metadata '{"tokenizer": ...}'`; period <= 24.
"""
from pathlib import Path

INCLUDE_PATH = str(Path(__file__).resolve().parent)
