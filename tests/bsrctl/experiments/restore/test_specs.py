"""Spec errors: one line naming the field and the fix (BadInput, exit code 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bsrctl.errors import BadInput
from bsrctl.experiments.restore.spec import load_experiment
from bsrctl.spec_io import parse_bytes

LADDERS = Path(__file__).parents[4] / "ladders"


def bad(tmp_path: Path, text: str, command: str = "sweep", stack: str = "storage") -> str:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    with pytest.raises(BadInput) as e:
        load_experiment(p, command, stack)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_shipped_specs_load_for_their_stacks() -> None:
    for name, stacks in {
        "cpu-smoke": ("serving", "storage"),
        "cpu-e1": ("serving", "storage"),
        "storage-paper": ("storage",),
        "dsv4-flash-tp2": ("serving",),
    }.items():
        for command in ("ladder", "sweep", "law"):
            for stack in stacks:
                spec, raw = load_experiment(LADDERS / f"{name}.yaml", command, stack)
                assert getattr(spec, command) is not None and raw


def test_paper_geometry_is_the_papers() -> None:
    spec, _ = load_experiment(LADDERS / "storage-paper.yaml", "sweep", "storage")
    reg = spec.registration_for("storage")
    assert (reg.bytes_per_chunk, reg.num_tensors, reg.window_bytes(32)) == (
        16_408_576,
        167,
        525_074_432,
    )
    assert spec.sweep.sizes_tokens == [32768, 65536, 131072, 262144, 393216, 524032]
    assert spec.ladder.rungs_bytes == [2 << 30, 8 << 30, 16 << 30, 32 << 30]
    tp2, _ = load_experiment(LADDERS / "dsv4-flash-tp2.yaml", "ladder", "serving")
    assert tp2.registration_for("serving").tp_size == 2
    assert tp2.stack.lmcache.chunk_size == 256 and tp2.stack.mooncake.enabled


def test_missing_section_names_it_and_the_sections_present(tmp_path: Path) -> None:
    msg = bad(tmp_path, "law: {tokens: 4096}\n", "sweep")
    assert "sweep: section missing; add a `sweep:` section (sections here: law" in msg


def test_unknown_field_lists_valid_ones(tmp_path: Path) -> None:
    msg = bad(tmp_path, "sweep: {sizes_tokens: [1024], windw_chunks: 4}\n")
    want = "sweep.windw_chunks: unknown field; valid fields here: sizes_tokens, window_chunks"
    assert want in msg


@pytest.mark.parametrize(
    ("text", "command", "stack", "needles"),
    [
        ("sweep: {sizes_tokens: [2048, 1024]}\n", "sweep", "storage",
         ["sweep.sizes_tokens", "strictly increasing", "sort them"]),
        ("sweep: {sizes_tokens: [100]}\n", "sweep", "storage",
         ["sweep.sizes_tokens[0]: 100 tokens is less than one 256-token chunk"]),
        ("ladder: {sizes_tokens: [1024], rungs_bytes: [2 GiB, 1 GiB]}\n", "ladder", "storage",
         ["ladder.rungs_bytes", "strictly increasing"]),
        ("ladder: {sizes_tokens: [1024], rungs_bytes: [2 gigs]}\n", "ladder", "storage",
         ["ladder.rungs_bytes.0", "not a byte size", "'2 GiB'"]),
        ("law: {tokens: 4096, windows_chunks: [8, 16]}\n", "law", "storage",
         ["law.windows_chunks", "at least 3 distinct windows"]),
        ("law: {tokens: 2048, windows_chunks: [2, 4, 16]}\n", "law", "storage",
         ["law.windows_chunks: W [16] exceed the prefix's 8 chunks", "law.tokens to >= 4096"]),
        ("stack: {lmcache: {window_chunks: 4}}\nsweep: {sizes_tokens: [1024]}\n", "sweep",
         "storage", ["stack.lmcache.window_chunks: unknown field", "chunk_size"]),
        ("sweep: {sizes_tokens: [32768]}\n", "sweep", "serving",
         ["stack.vllm.max_model_len: 20480 < 32784", "raise it or shorten"]),
        ("sweep: {sizes_tokens: [1024], window_chunks: 4, admission_budget_chunks: 2}\n",
         "sweep", "storage",
         ["sweep.admission_budget_chunks: admission_budget_chunks = 2 < window_chunks = 4: "
          "set B >= W or 0"]),
        ("stack: {lmcache: {l1_size_bytes: 1048576}}\n"
         "sweep: {sizes_tokens: [8192], window_chunks: 2, whole_plan_contrast: true}\n", "sweep",
         "storage",
         ["sweep.whole_plan_contrast", "needs 8388608 B", "l1_size_bytes = 1048576"]),
        ("stack: {lmcache: {l1_size_bytes: 1048576}}\n"
         "sweep: {sizes_tokens: [4096], window_chunks: 8}\n", "sweep", "storage",
         ["sweep.window_chunks: W = 8 needs a restore pool of 2097152 B (W x c x 1 ranks + aux)",
          "> stack.lmcache.l1_size_bytes = 1048576; raise L1 or lower W"]),
        ("stack: {lmcache: {l1_size_bytes: 1048576}}\n"
         "law: {tokens: 8192, windows_chunks: [2, 4, 8]}\n", "law", "serving",
         ["law.windows_chunks: W = 8 needs a restore pool of 2097152 B"]),
        ("registration: tiny-llama\nstorage: {tp_ranks: 4}\nsweep: {sizes_tokens: [1024]}\n",
         "sweep", "storage", ["storage.tp_ranks: tiny-llama has 2 KV heads, TP 4"]),
        ("storage: {tp_ranks: 3}\nsweep: {sizes_tokens: [1024]}\n", "sweep", "storage",
         ["storage.tp_ranks: 3 does not divide the 4 query (attention) heads of the model "
          "(config.json num_attention_heads; it has 2 KV heads); vLLM refuses it: set "
          "storage.tp_ranks to one of 1, 2, 4"]),
        ("registration: llama\nsweep: {sizes_tokens: [1024]}\n", "sweep", "storage",
         ["registration", "tiny-llama", "dsv4-flash"]),
    ],
)  # fmt: skip
def test_errors_name_the_field_and_the_fix(
    tmp_path: Path, text: str, command: str, stack: str, needles: list[str]
) -> None:
    msg = bad(tmp_path, text, command, stack)
    for needle in needles:
        assert needle in msg, msg


QWEN25_7B_HEADS = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
    "torch_dtype": "bfloat16",
}  # fmt: skip


@pytest.mark.parametrize(
    ("tp", "message"),
    [
        # 8 is a multiple of the 4 KV heads (vLLM copies them), but 28 query heads do not split
        (8, "stack.vllm.tensor_parallel_size: 8 does not divide the 28 query (attention) heads "
            "of the model (config.json num_attention_heads; it has 4 KV heads); vLLM refuses "
            "it: set stack.vllm.tensor_parallel_size to one of 1, 2, 4, 28"),
        # 7 divides the 28 query heads; the 4 KV heads are what it fails
        (7, "stack.vllm.tensor_parallel_size: 7 does not divide the 4 KV heads of "
            "Qwen2ForCausalLM (nor is it a multiple of them, with 28 query heads); vLLM "
            "refuses it"),
    ],
)  # fmt: skip
def test_a_tp_is_refused_for_the_heads_it_does_not_divide(
    tmp_path: Path, tp: int, message: str
) -> None:
    model = tmp_path / "Qwen2.5-7B-Instruct"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN25_7B_HEADS))
    text = (
        f"stack: {{vllm: {{model: {model}, tensor_parallel_size: {tp}}}}}\n"
        "registration: auto\nsweep: {sizes_tokens: [1024]}\n"
    )
    assert bad(tmp_path, text, "sweep", "serving") == f"{tmp_path / 'spec.yaml'}: {message}"


def test_bad_stack_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="--stack: 'sim' is not one of serving, storage, attach"):
        load_experiment(LADDERS / "cpu-e1.yaml", "sweep", "sim")
    with pytest.raises(BadInput, match="does not exist"):
        load_experiment(tmp_path / "nope.yaml", "sweep", "storage")


def test_byte_sizes() -> None:
    assert parse_bytes("2 GiB") == 2 << 30
    assert parse_bytes("512MiB") == 512 << 20
    assert parse_bytes("1.5 KiB") == 1536
    assert parse_bytes("3 GB") == 3_000_000_000
    assert parse_bytes(7) == 7
    with pytest.raises(ValueError, match="whole number"):
        parse_bytes("1.3 B")


def test_stack_kind_is_the_one_selector_and_stack_overrides_it(tmp_path: Path) -> None:
    from bsrctl.specs import stack_selection

    paper, _ = load_experiment(LADDERS / "storage-paper.yaml", "sweep")
    assert paper.stack.kind == "storage"  # `kind: storage` is read: no --stack needed
    assert stack_selection(paper, None) == {"kind": "storage", "kind_selected_by": "stack.kind"}
    e1, _ = load_experiment(LADDERS / "cpu-e1.yaml", "sweep")
    assert e1.stack.kind == "serving"
    over, _ = load_experiment(LADDERS / "cpu-e1.yaml", "sweep", "storage")
    assert over.stack.kind == "storage"
    assert stack_selection(over, "storage") == {"kind": "storage", "kind_selected_by": "--stack"}
    assert over.stack.model_dump(exclude={"kind"}) == e1.stack.model_dump(exclude={"kind"})


def test_an_override_that_leaves_the_stack_incoherent_names_it(tmp_path: Path) -> None:
    text = (
        (LADDERS / "cpu-smoke.yaml")
        .read_text()
        .replace(
            "stack:\n  kind: serving\n",
            "stack:\n  kind: attach\n  attach:\n    vllm_url: http://127.0.0.1:9\n"
            "    lmcache_url: tcp://127.0.0.1:10\n    lmcache_http_port: 11\n",
        )
    )
    assert "kind: attach" in text
    msg = bad(tmp_path, text, "sweep", "serving")
    p = tmp_path / "spec.yaml"
    assert msg == f"{p}: --stack serving: attach: given with kind 'serving'; set kind: attach"
    spec, _ = load_experiment(p, "sweep")
    assert spec.stack.kind == "attach"


def test_a_ladder_whose_aux_exceeds_l1_names_aux_bytes(tmp_path: Path) -> None:
    """W = 0 has no window to name (found by tests/bsrctl/test_spec_fuzz.py: max() of no
    windows)."""
    text = (LADDERS / "cpu-e1.yaml").read_text().replace("aux_bytes: 0", "aux_bytes: 1" + "0" * 30)
    p = tmp_path / "s.yaml"
    p.write_text(text)
    why = r"s\.yaml: aux_bytes: 10{30} B > stack.lmcache.l1_size_bytes = 67108864; lower"
    with pytest.raises(BadInput, match=why + r" aux_bytes or raise L1$"):
        load_experiment(p, "ladder", "serving")
