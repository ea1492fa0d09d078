"""The package builder: layout, weights, ONNX graph, determinism, tokenizer and pruning."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edge.preload.manifest import open_package
from edge.preload.weights import map_weights
from image.package import compare_builds, source_dir
from image.package_cli import main
from support.parity import BASE

DOMAIN = [  # the pruning corpus: maintenance English
    "Replace the air filter every 500 operating hours.",
    "Check the hydraulic pressure before starting the pump.",
    "The conveyor belt on line 3 stopped after a motor fault.",
    "Temperature sensor T-104 reported an overheating warning.",
    "Restart the controller and inspect the valve for leaks.",
    "Lubricate the bearings and tighten the drive chain.",
] * 5


def test_build_is_deterministic(minilm_package, tmp_path):
    """A second build, through the CLI, is byte-identical (or the manifest says why not), its one
    measured input, the fresh boots' budget, pinned to the first build's (image/fresh_boot.py)."""
    fresh = json.loads((minilm_package / "manifest.json").read_text())["selftest"]["fresh_boot_budget_ms"]
    pins = [a for engine, ms in sorted(fresh.items()) for a in ("--fresh-boot-budget-ms", f"{engine}={ms:g}")]
    assert main(["build", "--out", str(tmp_path / "again"), *pins]) == 0
    assert json.loads((tmp_path / "again" / "fresh_boot.json").read_text())["runs"] == {}  # pinned: no boot measured
    diff = compare_builds(minilm_package, tmp_path / "again")
    declared = json.loads((minilm_package / "manifest.json").read_text())["nondeterministic"]
    assert set(diff) - {"manifest.json"} <= set(declared), diff
    assert diff == {}, f"not byte-identical: {diff}"


def test_fresh_boot_budget_is_measured_for_each_engine(minilm_package):
    """selftest.fresh_boot_budget_ms: 3 x the slowest of the build's own fresh boots of each engine, on
    the ladder, never under the boot budget; the runs beside the manifest, in no hash."""
    from image.fresh_boot import RUNS, budget_ms

    manifest = json.loads((minilm_package / "manifest.json").read_text())
    report = json.loads((minilm_package / "fresh_boot.json").read_text())
    fresh, floor = manifest["selftest"]["fresh_boot_budget_ms"], manifest["selftest"]["boot_budget_ms"]
    assert sorted(fresh) == sorted(manifest["engines"]) == ["onnxruntime", "torchscript"]
    for engine, ms in fresh.items():
        runs = report["runs"][engine]
        assert len(runs) == RUNS and all(0 < r < ms for r in runs), (engine, runs, ms)
        assert ms == budget_ms(runs, floor) >= floor
    assert "fresh_boot.json" not in manifest["files"]
    print(f"\nfresh boots on this host (ms): {report['runs']}; fresh_boot_budget_ms: {fresh}")


def test_build_refuses_to_replace_a_non_package(tmp_path):
    from image.package import build_package

    (tmp_path / "notes.txt").write_text("precious")
    with pytest.raises(FileExistsError):
        build_package(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "precious"


def test_weights_are_aligned_and_equal_the_source(minilm_package):
    from safetensors.numpy import load_file

    wm = map_weights(minilm_package / "weights.safetensors", alignment=64)  # raises if any tensor is unaligned
    src = load_file(str(source_dir() / "model.safetensors"))
    np.testing.assert_array_equal(wm["embeddings.word"], src["embeddings.word_embeddings.weight"])
    qkv = np.concatenate([src[f"encoder.layer.5.attention.self.{n}.weight"] for n in ("query", "key", "value")])
    np.testing.assert_array_equal(wm["layers.5.qkv.weight"], qkv)
    assert wm.nbytes > 85_000_000 and len(wm) == 5 + 6 * 12
    # The reference reader agrees with our writer.
    ours = load_file(str(minilm_package / "weights.safetensors"))
    assert set(ours) == set(wm.tensors)
    wm.close()


def test_torchscript_is_a_weightless_skeleton(minilm_package):
    assert (minilm_package / "model.ts").stat().st_size < 100_000


def test_onnx_graph_io(minilm_package):
    import onnx

    model = onnx.load(str(minilm_package / "model.onnx"), load_external_data=False)
    assert {o.domain or "ai.onnx": o.version for o in model.opset_import}["ai.onnx"] == 17

    def dims(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    ins = {i.name: (i.type.tensor_type.elem_type, dims(i)) for i in model.graph.input}
    assert ins == {"input_ids": (onnx.TensorProto.INT64, ["batch", "sequence"]),
                   "attention_mask": (onnx.TensorProto.INT64, ["batch", "sequence"])}
    (out,) = model.graph.output
    assert (out.name, out.type.tensor_type.elem_type) == ("embedding", onnx.TensorProto.FLOAT)
    assert dims(out) == ["batch", 384]
    ops = {n.op_type for n in model.graph.node}
    assert {"ReduceSum", "Div"} <= ops and ({"ReduceL2"} & ops or {"Sqrt"} & ops)  # pooling and norm inside


def test_tokenizer_in_package(minilm_package):
    from image.tokenizer.compile import compile_tokenizer_json

    assert (minilm_package / "tokenizer.fb").read_bytes() == compile_tokenizer_json(source_dir() / "tokenizer.json")


def test_warm_sample_ids_are_the_warm_text_as_hugging_face_encodes_it(minilm_package):
    """The ids boot warms with, stored by the builder, are real tokenizer output (not made up)."""
    from tokenizers import Tokenizer as HfTokenizer

    from edge.warmup import WARM_TEXT

    serving = open_package(minilm_package, verify="none").manifest.serving
    hf = HfTokenizer.from_file(str(source_dir() / "tokenizer.json"))
    hf.no_padding()
    hf.enable_truncation(max(serving.buckets))
    assert serving.warm_sample_ids == hf.encode(WARM_TEXT).ids
    assert len(serving.warm_sample_ids) == max(serving.buckets)  # fills the largest bucket


@pytest.fixture(scope="module")
def pruned_package(tmp_path_factory):
    pytest.importorskip("image.tokenizer.prune")
    tmp = tmp_path_factory.mktemp("pruned")
    corpus = tmp / "domain.txt"
    corpus.write_text("\n".join(DOMAIN) + "\n")
    out = tmp / "pkg"
    assert main(["build", "--out", str(out), "--prune-corpus", str(corpus)]) == 0
    return out


def test_pruned_package_is_smaller_and_equal_on_the_domain(pruned_package, minilm_package):
    from edge.engines import load_engine
    from edge.preload.tokenizer import Tokenizer

    small, full = open_package(pruned_package), open_package(minilm_package)
    v = small.manifest.vocab_size
    assert v < full.manifest.vocab_size
    assert small.manifest.source["pruned"]["vocab_size"] == v
    assert small.manifest.files["weights.safetensors"].size < full.manifest.files["weights.safetensors"].size
    assert small.manifest.files["model.ort"].size < full.manifest.files["model.ort"].size
    wm = map_weights(pruned_package / "weights.safetensors")
    assert wm["embeddings.word"].shape == (v, 384)
    wm.close()
    tok_small = Tokenizer.open(pruned_package / "tokenizer.fb")
    tok_full = Tokenizer.open(minilm_package / "tokenizer.fb")
    assert tok_small.vocab_size == v
    from edge.warmup import WARM_TEXT

    warm = small.manifest.serving.warm_sample_ids  # in the pruned vocabulary, as its tokenizer encodes it
    assert warm == list(tok_small.encode(WARM_TEXT, max_length=max(small.manifest.serving.buckets)).ids)
    assert max(warm) < v
    texts = DOMAIN[:6]
    for name in ("onnxruntime", "torchscript"):
        a, b = load_engine(small, name, device="cpu"), load_engine(full, name, device="cpu")
        bs, bf = tok_small.encode_batch(texts, 32), tok_full.encode_batch(texts, 32)
        np.testing.assert_array_equal(tok_small.original_ids[bs.input_ids], bf.input_ids)
        np.testing.assert_allclose(a.run(bs.input_ids, bs.attention_mask), b.run(bf.input_ids, bf.attention_mask),
                                   atol=1e-6)
        # Off the domain, text still tokenizes (characters and pieces were kept) and runs.
        other = tok_small.encode_batch(["Съешь же ещё этих мягких булок", "日本語のテキスト", *BASE[:6]], 64)
        assert np.isfinite(a.run(other.input_ids, other.attention_mask)).all()
        a.close()
        b.close()
