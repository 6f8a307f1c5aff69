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
    import shutil

    from mindgr.serve.export import ExportError
    bundle = fx.random_bundle(num_items=30, prompt_tokens=8, dim=8, blocks=1, heads=2, level_sizes=(4, 4, 2))
    out, kept = tmp_path / "export", tmp_path / "kept"
    manifest = export_generative(bundle, out, beam=4, shapes=(1,))
    shutil.copytree(out, kept)                               # a pristine copy for the last case (CI time)
    listed = set(manifest["sha256"])
    assert listed == {p.name for p in out.iterdir()} - {"manifest.json"}     # every other file, no leftovers
    codes = out / "codes.npy"
    data = bytearray(codes.read_bytes())
    data[-1] ^= 1
    codes.write_bytes(bytes(data))
    with pytest.raises(ExportError) as e:
        load_generative_export(out)
    assert "codes.npy" in str(e.value) and "sha256" in str(e.value) and "\n" not in str(e.value)
    export_generative(bundle, out, beam=4, shapes=(1,))                     # exporting again repairs it
    load_generative_export(out)
    (out / "trie.npz").unlink()
    with pytest.raises(ExportError, match="trie.npz is missing"):
        load_generative_export(out)
    # an export from before the checksums (no "sha256" in its manifest) still loads
    m = json.loads((kept / "manifest.json").read_text())
    del m["sha256"]
    (kept / "manifest.json").write_text(json.dumps(m))
    load_generative_export(kept)


def test_linear_gr_export_round_trip_is_bit_identical(tmp_path):
    """A linear-attention decoder's export: OneLA's stacked prefill (-> the prompt states S_p) and decode
    step (S_p, the per-beam records, the ancestry index -> logits, records) as MindIR; the loaded step graph's
    outputs bit-identical to the in-process stacked cell's, the manifest recording the backbone and decays,
    and the engine on the loaded graphs (through bundle_from_export) giving the in-process engine's lists."""
    from mindgr.models.linear_decode import RecordState, decays_of
    bundle = fx.random_bundle(num_items=60, prompt_tokens=12, dim=8, blocks=2, heads=2, level_sizes=(4, 4, 4, 2),
                              backbone="linear")
    manifest = export_generative(bundle, tmp_path, beam=4, shapes=(2,))
    assert manifest["decoder"]["backbone"] == "linear" and sorted(manifest["graphs"]) == ["2"]
    np.testing.assert_array_equal(np.asarray(manifest["decoder"]["decays"], np.float32), decays_of(bundle.decoder))
    served = gr.bundle_from_export(tmp_path, manifest)          # the graphs loaded (mindspore.load), the trie
    assert served.decoder.backbone == "linear"
    np.testing.assert_array_equal(served.codes, bundle.codes)

    dec, p_cap = bundle.decoder, manifest["prompt_tokens"]
    rng = np.random.default_rng(0)
    hists = [rng.integers(1, 60, size=n) for n in (5, 2)]
    want = gr.GenerativeRecommender(bundle, beam=4, shapes=(2,)).engines[0][2]    # the tuple cells (in-process)
    want_items, want_scores = want.search(hists, 4)
    stacked = RecordState(dec, 2, 4, p_cap, stacked=True)         # the exported form, in-process
    prompts = dec.prompts(hists, bundle.codes, p_cap)
    level0 = stacked.prefill(prompts)
    prefill, step = served.decoder.graphs[2]
    loaded = RecordState(served.decoder, 2, 4, p_cap, graphs=(prefill, step))
    assert stacked.gives_hidden and not loaded.gives_hidden    # loaded graphs: the engine scores from logits
    np.testing.assert_array_equal(loaded.prefill(prompts), level0)
    np.testing.assert_array_equal(loaded.sp.asnumpy(), stacked.sp.asnumpy())
    parents = [np.zeros((2, 4), np.int64), rng.integers(0, 4, size=(2, 4)), rng.integers(0, 4, size=(2, 4))]
    for level in (1, 2, 3):
        codes_in = rng.integers(0, 4, size=(2, 4))
        a = stacked.step(level, codes_in, parents[:level])
        b = loaded.step(level, codes_in, parents[:level])
        np.testing.assert_array_equal(a, b)                                     # bit-identical on the CPU
        np.testing.assert_array_equal(loaded.kr.asnumpy(), stacked.kr.asnumpy())
        np.testing.assert_array_equal(loaded.vr.asnumpy(), stacked.vr.asnumpy())
    step_inputs = stacked.last_step_inputs
    for x, y in zip(step(*step_inputs), stacked.step_net(*step_inputs)):
        np.testing.assert_array_equal(x.asnumpy(), y.asnumpy())

    eng = gr.GenerativeRecommender(served, beam=4, shapes=(2,)).engines[0][2]    # the loaded graphs again
    items, scores = eng.search(hists, 4)
    np.testing.assert_array_equal(items, want_items)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-6, atol=1e-6)
    eng.state = stacked                                      # the same engine on the in-process stacked cells
    got_items, got_scores = eng.search(hists, 4)
    np.testing.assert_array_equal(got_items, items)
    np.testing.assert_array_equal(got_scores, scores)
    with pytest.raises(ValueError, match="shared-cache graphs"):
        served.decoder.decode_state(2, 4, p_cap, layout="per_beam")
