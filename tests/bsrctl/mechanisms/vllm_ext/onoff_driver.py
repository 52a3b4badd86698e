"""Runs offline vLLM (the tiny model, CPU) with one scheduler class over fixed prompts and
writes the outputs; the scheduler writes its per-step trace (BSRKV_TEMPOKV.trace_path).

    python onoff_driver.py MODEL_DIR SCHEDULER_CLS OUT_JSON
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    model_dir, scheduler_cls, out = sys.argv[1:4]
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from bsrctl.prompts import prompt_ids
    from bsrctl.stack.launch.tinymodel import vocab_size

    vocab = vocab_size(__import__("pathlib").Path(model_dir))
    lengths = [1200, 700, 1500, 520, 900, 1100]  # several chunked-prefill steps each
    prompts = [TokensPrompt(prompt_token_ids=prompt_ids(f"onoff-{i}", n, vocab))
               for i, n in enumerate(lengths)]  # fmt: skip
    llm = LLM(
        model=model_dir,
        enforce_eager=True,
        dtype="float32",
        seed=0,
        max_model_len=2048,
        max_num_seqs=2,
        max_num_batched_tokens=512,
        distributed_executor_backend="uni",
        scheduler_cls=scheduler_cls,
    )
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in (3, 9, 5, 12, 4, 7)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    with open(out, "w") as f:
        json.dump({o.request_id: list(o.outputs[0].token_ids) for o in outs}, f)


if __name__ == "__main__":
    main()
