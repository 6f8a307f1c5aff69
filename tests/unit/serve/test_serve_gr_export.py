"""GR export round trip: the prefill and decode-step graphs written as MindIR (mindspore.export), loaded
back (mindspore.load + nn.GraphCell), give bit-identical outputs to the in-memory cells, and a decoding
engine running on the loaded graphs gives the same lists; the code table and trie arrays round-trip."""
import numpy as np
import pytest

from mindgr.bench import fixtures as fx
from mindgr.serve import generative as gr
from mindgr.serve.export import export_generative, load_generative_export

pytestmark = pytest.mark.graph_mode("auto")


def test_gr_export_round_trip_is_bit_identical(tmp_path):
    bundle = fx.random_bundle(num_items=60, prompt_tokens=12, dim=8, blocks=2, heads=2, level_sizes=(4, 4, 4, 2))
    manifest = export_generative(bundle, tmp_path, beam=4, shapes=(1,))
    got, graphs, codes, trie, raw = load_generative_export(tmp_path)
    assert got == manifest and manifest["kind"] == "generative" and manifest["beam"] == 4
    assert manifest["prompt_tokens"] == 12 and manifest["decode_steps"] == 3
    np.testing.assert_array_equal(codes, bundle.codes)
    np.testing.assert_array_equal(raw, bundle.raw_ids)
    for level in range(bundle.trie.num_levels):
        np.testing.assert_array_equal(trie[f"keys{level}"], bundle.trie.keys[level])
        np.testing.assert_array_equal(trie[f"masks{level}"], bundle.trie.masks[level])

    rec = gr.GenerativeRecommender(bundle, beam=4, shapes=(1,))
    eng = rec.engines[0][1]
    hist = [np.array([3, 9, 17])]
    want_items, _ = eng.search(hist, 4)                   # the engine's own graphs (children scoring)
    eng.head = "full"                                      # the stacked graphs: what the export holds
    full_items, want_scores = eng.search(hist, 4)
    np.testing.assert_array_equal(full_items, want_items)
    step_inputs = eng.state.last_step_inputs
    want_step = [t.asnumpy() for t in eng.state.step_net(*step_inputs)]
    prefill, step = graphs[1]
    got_step = [t.asnumpy() for t in step(*step_inputs)]
    for a, b in zip(got_step, want_step):
        np.testing.assert_array_equal(a, b)                       # bit-identical on the CPU
    eng.state.prefill_net, eng.state.step_net = prefill, step
    items, scores = eng.search(hist, 4)
    np.testing.assert_array_equal(items, want_items)
    np.testing.assert_array_equal(scores, want_scores)


def test_a_tampered_or_missing_export_file_is_refused_naming_it(tmp_path):
    import json

    import pytest
    from mindgr.serve.export import ExportError
    bundle = fx.random_bundle(num_items=30, prompt_tokens=8, dim=8, blocks=1, heads=2, level_sizes=(4, 4, 2))
    manifest = export_generative(bundle, tmp_path, beam=4, shapes=(1,))
    listed = set(manifest["sha256"])
    assert listed == {p.name for p in tmp_path.iterdir()} - {"manifest.json"}     # every other file, no leftovers
    codes = tmp_path / "codes.npy"
    data = bytearray(codes.read_bytes())
    data[-1] ^= 1
    codes.write_bytes(bytes(data))
    with pytest.raises(ExportError) as e:
        load_generative_export(tmp_path)
    assert "codes.npy" in str(e.value) and "sha256" in str(e.value) and "\n" not in str(e.value)
    export_generative(bundle, tmp_path, beam=4, shapes=(1,))                     # exporting again repairs it
    load_generative_export(tmp_path)
    (tmp_path / "trie.npz").unlink()
    with pytest.raises(ExportError, match="trie.npz is missing"):
        load_generative_export(tmp_path)
    # an export from before the checksums (no "sha256" in its manifest) still loads
    export_generative(bundle, tmp_path, beam=4, shapes=(1,))
    m = json.loads((tmp_path / "manifest.json").read_text())
    del m["sha256"]
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    load_generative_export(tmp_path)
