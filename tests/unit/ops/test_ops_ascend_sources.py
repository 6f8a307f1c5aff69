"""The Ascend backend's sources, checked on a CPU machine (no CANN, no NPU here).

- the registration module imports on CPU, imports nothing Ascend-only, and reports why it is unavailable;
- scripts/build_ascend_ops.sh stops with a clear message when CANN is missing or incomplete;
- the OpDefs (op_host/*.cpp), the kernel entry points (op_kernel/*.cpp) and the Python registration
  declare the same inputs, outputs and attributes, and the kernels only read tiling fields that exist;
- the work split (tests/ascend_plan.py, mirrored by WorkPlan in op_kernel/hstu_common.h) covers
  every (row, head, query) exactly once and balances long-tailed batches; a scan written like the
  kernel's WorkPlan::Next gives the same assignment;
- a numpy execution of the kernels' blocked algorithm, item by item in plan order with per-worker
  weight-gradient partials summed in worker order, matches mindgr.ops.reference (forward) and its
  MindSpore gradients (backward).
What this cannot check: that the C++ compiles, or anything about the device (see docs/ascend_ops.md).
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import ascend_plan as plan  # noqa: E402  (tests/ is on sys.path, as for ops_fixtures)

from conftest import REPO
ASC = REPO / "mindgr" / "ops" / "ascend"
SCRIPT = REPO / "scripts" / "build_ascend_ops.sh"


# ------------------------------------------------------------------------------------------------
# Registration module and build script

def test_module_imports_on_cpu_without_ascend_modules():
    code = ("import sys; before = set(sys.modules); import mindgr.ops.ascend as a; "
            "new = set(sys.modules) - before; "
            "bad = [m for m in new if m.split('.')[0] in ('acl', 'te', 'tbe', 'torch_npu', 'mindspore')]; "
            "print(bad); assert not bad, bad; print(a.unavailable_reason())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    reason = res.stdout.strip().splitlines()[-1]
    assert "not Ascend" in reason or "MindSpore is not installed" in reason


def test_unavailable_reason_is_one_line_and_primitives_refuse():
    from mindgr.ops import ascend
    reason = ascend.unavailable_reason()
    assert isinstance(reason, str) and reason and "\n" not in reason
    with pytest.raises(RuntimeError, match="cannot run here"):
        ascend._primitives()


def _run_script(env_updates, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_")}
    env.update(env_updates)
    env["PYTHON"] = sys.executable
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env)


def test_build_script_without_cann_fails_clearly():
    res = _run_script({})
    assert res.returncode != 0
    assert "ASCEND_HOME_PATH is not set" in res.stderr and "set_env.sh" in res.stderr


def test_build_script_with_incomplete_cann_fails_clearly(tmp_path):
    res = _run_script({"ASCEND_HOME_PATH": str(tmp_path), "ASCEND_OPP_PATH": str(tmp_path)},
                      "--out", str(tmp_path / "out"))
    assert res.returncode != 0
    assert "operator project template" in res.stderr


def test_build_script_rejects_unknown_arguments():
    res = _run_script({}, "--frobnicate")
    assert res.returncode != 0 and "unknown argument" in res.stderr


# ------------------------------------------------------------------------------------------------
# Sources agree with each other

def _opdef(path):
    src = path.read_text()
    inputs = re.findall(r'this->Input\("(\w+)"\)', src)
    outputs = re.findall(r'this->Output\("(\w+)"\)', src)
    attrs = re.findall(r'this->Attr\("(\w+)"\)\.AttrType\(REQUIRED\)\.(\w+)\(\)', src)
    op = re.search(r"OP_ADD\((\w+)\)", src).group(1)
    return op, tuple(inputs), tuple(outputs), tuple((a, t.lower()) for a, t in attrs)


def _kernel_params(path, func):
    src = path.read_text()
    m = re.search(r'extern "C" __global__ __aicore__ void ' + func + r"\(([^)]*)\)", src)
    assert m, f"{func} not found in {path}"
    return tuple(p.split()[-1] for p in m.group(1).split(","))


@pytest.mark.parametrize("host,kernel,func,op,inputs,outputs", [
    ("hstu_jagged_attention.cpp", "hstu_jagged_attention.cpp", "hstu_jagged_attention", "OP_FWD",
     "FWD_INPUTS", "FWD_OUTPUTS"),
    ("hstu_jagged_attention_grad.cpp", "hstu_jagged_attention_grad.cpp", "hstu_jagged_attention_grad",
     "OP_BWD", "BWD_INPUTS", "BWD_OUTPUTS"),
])
def test_opdef_kernel_and_registration_agree(host, kernel, func, op, inputs, outputs):
    from mindgr.ops import ascend
    name, ins, outs, attrs = _opdef(ASC / "op_host" / host)
    assert name == getattr(ascend, op)
    assert ins == getattr(ascend, inputs)
    assert outs == getattr(ascend, outputs)
    assert attrs == ascend.ATTRS
    # kernel entry: inputs, outputs, workspace, tiling (attributes travel in the tiling data)
    assert _kernel_params(ASC / "op_kernel" / kernel, func) == ins + outs + ("workspace", "tiling")
    # snake_case kernel name of the op type, as the CANN build expects
    assert re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() == func
    # the Python reg info (built on CPU: CustomRegOp is plain Python) says the same
    info = ascend._reg_info(name, ins, outs, None)
    assert tuple(x["name"] for x in info["inputs"]) == ins
    assert tuple(x["name"] for x in info["outputs"]) == outs
    assert tuple((a["name"], a["type"]) for a in info["attr"]) == ascend.ATTRS
    assert info["target"] == "Ascend" and len(info["dtype_format"]) == 3
    for row in info["dtype_format"]:
        assert len(row) == len(ins) + len(outs)


def test_kernels_read_only_declared_tiling_fields_and_share_constants():
    header = (ASC / "op_host" / "hstu_attention_tiling.h").read_text()
    fields = set(re.findall(r"TILING_DATA_FIELD_DEF(?:_ARR|_STRUCT)?\([^,]+,\s*(?:\d+,\s*)?(\w+)\)", header))
    assert {"numTokens", "maxLen", "bucketBound", "mmNT", "mmNN", "wPosLen"} <= fields
    common = (ASC / "op_kernel" / "hstu_common.h").read_text()
    for kernel in ("hstu_jagged_attention.cpp", "hstu_jagged_attention_grad.cpp"):
        src = (ASC / "op_kernel" / kernel).read_text()
        used = set(re.findall(r"\btd_?->(\w+)", src)) | set(re.findall(r"&td\.(\w+)", src))
        assert used and used <= fields, used - fields
    assert int(re.search(r"HSTU_BLOCK = (\d+)", common).group(1)) == plan.BLOCK
    assert int(re.search(r"BLOCK = (\d+);", header).group(1)) == plan.BLOCK
    assert int(re.search(r"HSTU_MAX_BUCKET = (\d+)", common).group(1)) == plan.MAX_BUCKET
    assert int(re.search(r"HSTU_NUM_BOUNDS = (\d+)", common).group(1)) == plan.NUM_BOUNDS
    assert f"bucketBound" in header and f"float, {plan.NUM_BOUNDS}, bucketBound" in header


# ------------------------------------------------------------------------------------------------
# The work plan

def long_tailed_offsets(rng, rows, max_len, tail=7, cut=3):
    lengths = np.clip(np.round(rng.lognormal(np.log(max_len / 8), 1.2, rows)), 0, max_len).astype(np.int64)
    lengths[: min(cut, rows)] = max_len + rng.integers(1, max_len // 2 + 2, min(cut, rows))  # cut rows
    lengths[-1] = 0
    rng.shuffle(lengths)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return offsets, int(offsets[-1]) + tail


def kernel_scan(offsets, num_tokens, heads, max_len, workers, me, backward):
    """WorkPlan::Next of op_kernel/hstu_common.h, transcribed (row skipping included)."""
    spans = plan.row_spans(offsets, num_tokens, max_len)
    kinds = (plan.KIND_DQ, plan.KIND_DKV) if backward else (plan.KIND_FWD,)
    row_cost = [heads * sum(plan.item_cost(k, le, b) for k in kinds for b in range((le + plan.BLOCK - 1) // plan.BLOCK))
                for _, _, le in spans]
    total = sum(row_cost)

    def owner(start, cost):
        return 0 if total == 0 else min(((2 * start + cost) * workers) // (2 * total), workers - 1)

    out, row_start = [], 0
    for b, (_, _, le) in enumerate(spans):
        rc = row_cost[b]
        if rc == 0 or owner(row_start + rc - 1, 1) < me:
            row_start += rc
            continue
        if owner(row_start, 1) > me:
            return out
        start = row_start
        for h in range(heads):
            for kind in kinds:
                for blk in range((le + plan.BLOCK - 1) // plan.BLOCK):
                    c = plan.item_cost(kind, le, blk)
                    w = owner(start, c)
                    start += c
                    if w == me:
                        out.append((b, h, kind, blk, c))
                    elif w > me:
                        return out
        row_start += rc
    return out


@pytest.mark.parametrize("workers", [1, 5, 48])
@pytest.mark.parametrize("backward", [False, True])
def test_plan_covers_every_query_once_and_matches_kernel_scan(workers, backward):
    rng = np.random.default_rng(workers + 10 * backward)
    n, heads = 300, 3
    offsets, t = long_tailed_offsets(rng, 40, n)
    per = plan.plan(offsets, t, heads, n, workers, backward)
    spans = plan.row_spans(offsets, t, n)
    kinds = (plan.KIND_DQ, plan.KIND_DKV) if backward else (plan.KIND_FWD,)
    for kind in kinds:
        seen = np.zeros((t, heads), np.int64)
        for items in per.values():
            for b, h, k, blk, _ in items:
                if k != kind:
                    continue
                s, _, le = spans[b]
                i0 = blk * plan.BLOCK
                seen[s + i0: s + min(le, i0 + plan.BLOCK), h] += 1
        dead = plan.dead_tokens(offsets, t, n)
        seen[dead] += 1
        assert (seen == 1).all()
    # dead tokens: cut parts and the tail, split into disjoint shares
    dead = plan.dead_tokens(offsets, t, n)
    assert len(dead) == len(set(dead)) and t - 1 in dead
    shares = [plan.dead_share(len(dead), w, workers) for w in range(workers)]
    assert shares[0][0] == 0 and shares[-1][1] == len(dead)
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
    for w in range(workers):
        assert kernel_scan(offsets, t, heads, n, workers, w, backward) == per[w]


@pytest.mark.parametrize("workers", [8, 48])
def test_plan_balances_long_tailed_batches(workers):
    rng = np.random.default_rng(7)
    n, heads = 4096, 8
    offsets, t = long_tailed_offsets(rng, 256, n, cut=2)
    for backward in (False, True):
        per = plan.plan(offsets, t, heads, n, workers, backward)
        loads = np.array([sum(c for *_, c in per[w]) for w in range(workers)], np.float64)
        max_item = max(c for items in per.values() for *_, c in items)
        mean = loads.sum() / workers
        assert loads.max() <= mean + max_item  # the midpoint rule's bound
        assert loads.max() / mean < 1.05, (loads.max() / mean, backward)
    # one row holding most of the work is spread over (nearly) all workers
    offsets = np.concatenate([[0], np.cumsum([20] * 60 + [n] + [30] * 60)]).astype(np.int32)
    for backward in (False, True):
        per = plan.plan(offsets, int(offsets[-1]), heads, n, workers, backward)
        owners = {w for w in range(workers) for b, *_ in per[w] if b == 60}
        assert len(owners) >= 0.8 * workers


def test_kernel_bucket_matches_the_float32_formula():
    rng = np.random.default_rng(3)
    bounds = plan.bucket_bounds()
    tq = rng.integers(0, 2 ** 45, 50000)
    tk = tq - np.floor(np.exp(rng.uniform(0, 31, 50000))).astype(np.int64) * rng.choice([-1, 1], 50000)
    for nb in (0, 1, 40, 128, 1000):
        gap = np.maximum(np.abs(tq - tk), 1).astype(np.float32)
        want = np.minimum(np.maximum(np.floor(np.log(gap) / np.float32(0.301)), 0), nb).astype(np.int64)
        assert (plan.kernel_bucket(tq, tk, nb, bounds) == want).all()
    # exactly at the thresholds
    for k in range(1, 60):
        g = bounds[k]
        below = np.nextafter(g, np.float32(0))
        assert plan.bucket_formula_f32(g) >= k > plan.bucket_formula_f32(below)


# ------------------------------------------------------------------------------------------------
# The blocked algorithm in numpy, item by item, against the reference

def _silu(x):
    return x / (1.0 + np.exp(-x))


def emulate(q, k, v, offsets, ts, req, w_pos, w_ts, n, workers, dout=None):
    """Forward (and backward with dout) following the kernels' item decomposition, float32."""
    t, heads, _ = q.shape
    nb = len(w_ts) - 1
    bounds = plan.bucket_bounds()
    inv_n = np.float32(1.0) / np.float32(n)
    spans = plan.row_spans(offsets, t, n)
    out = np.full((t, heads, v.shape[2]), np.nan, np.float32)
    grads = None
    if dout is not None:
        grads = [np.full(q.shape, np.nan, np.float32), np.full(k.shape, np.nan, np.float32),
                 np.full(v.shape, np.nan, np.float32)]
        pos_part = np.zeros((workers, len(w_pos)), np.float32)
        ts_part = np.zeros((workers, len(w_ts)), np.float32)
    for arr in [out] + (grads or []):
        arr[plan.dead_tokens(offsets, t, n)] = 0.0

    def scores(s, le, row, i_idx, j_idx, h):
        qi, kj = q[s + i_idx, h], k[s + j_idx, h]
        tt = ts[s: s + le]
        tq = np.where(i_idx + 1 < le, tt[np.minimum(i_idx + 1, le - 1)], req[row])  # last: request time
        b = plan.kernel_bucket(tq[:, None], tt[j_idx][None, :], nb, bounds)
        sc = qi @ kj.T + w_pos[n - 1 + j_idx[None, :] - i_idx[:, None]] + w_ts[b]
        return sc.astype(np.float32), b

    per = plan.plan(offsets, t, heads, n, workers, backward=dout is not None)
    for w in range(workers):
        for row, h, kind, blk, _ in per[w]:
            s, _, le = spans[row]
            a0 = blk * plan.BLOCK
            rows = np.arange(a0, min(le, a0 + plan.BLOCK))
            if kind == plan.KIND_FWD:
                keys = np.arange(0, rows[-1] + 1)
                sc, _ = scores(s, le, row, rows, keys, h)
                p = np.where(keys[None, :] <= rows[:, None], _silu(sc) * inv_n, 0.0)
                out[s + rows, h] = p @ v[s + keys, h]
            elif kind == plan.KIND_DQ:
                keys = np.arange(0, rows[-1] + 1)
                sc, b = scores(s, le, row, rows, keys, h)
                g = dout[s + rows, h] @ v[s + keys, h].T
                sig = 1.0 / (1.0 + np.exp(-sc))
                ds = np.where(keys[None, :] <= rows[:, None], g * sig * (1 + sc * (1 - sig)) * inv_n, 0.0)
                grads[0][s + rows, h] = ds @ k[s + keys, h]
                causal = keys[None, :] <= rows[:, None]
                np.add.at(pos_part[w], (n - 1 + keys[None, :] - rows[:, None])[causal], ds[causal])
                np.add.at(ts_part[w], b[causal], ds[causal])
            else:
                qs = np.arange(a0, le)
                sc, _ = scores(s, le, row, qs, rows, h)         # [queries, keys of the block]
                g = dout[s + qs, h] @ v[s + rows, h].T
                sig = 1.0 / (1.0 + np.exp(-sc))
                causal = rows[None, :] <= qs[:, None]
                p = np.where(causal, sc * sig * inv_n, 0.0)
                ds = np.where(causal, g * sig * (1 + sc * (1 - sig)) * inv_n, 0.0)
                grads[1][s + rows, h] = ds.T @ q[s + qs, h]
                grads[2][s + rows, h] = p.T @ dout[s + qs, h]
    if dout is None:
        return out
    dw_pos = np.zeros(len(w_pos), np.float32)
    dw_ts = np.zeros(len(w_ts), np.float32)
    for w in range(workers):  # fixed order
        dw_pos += pos_part[w]
        dw_ts += ts_part[w]
    return out, grads + [dw_pos, dw_ts]


def _case(seed, n=20, heads=2, dqk=8, dv=8, nb=30):
    rng = np.random.default_rng(seed)
    lengths = [0, 1, n, n + 5, 7, 13, 3, 19]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    t = int(offsets[-1]) + 4
    steps = np.floor(np.exp(rng.uniform(0.0, 14.0, t))) * (rng.random(t) < 0.8)
    ts = (10 ** 9 + np.cumsum(steps)).astype(np.int64)
    # request times: the row's last kept time or later (the query time of its last position)
    last = ts[np.clip(np.minimum(offsets[1:], offsets[:-1] + n) - 1, 0, t - 1)]
    req = (last + np.floor(np.exp(rng.uniform(0.0, 14.0, len(lengths)))) * (rng.random(len(lengths)) < 0.7))
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return (f(t, heads, dqk) * 0.5, f(t, heads, dqk) * 0.5, f(t, heads, dv), offsets, ts, req.astype(np.int64),
            f(2 * n - 1) * 0.3, f(nb + 1) * 0.3, n)


def test_blocked_emulation_matches_reference_forward_and_gradients(monkeypatch):
    ms = pytest.importorskip("mindspore")
    from mindspore import Tensor
    from mindgr.ops import reference

    monkeypatch.setattr(plan, "BLOCK", 4)      # several blocks per row at this small N
    monkeypatch.setattr(plan, "ITEM_OVERHEAD", 16)
    q, k, v, offsets, ts, req, w_pos, w_ts, n = _case(0)
    dout = np.random.default_rng(1).standard_normal((q.shape[0], q.shape[1], v.shape[2])).astype(np.float32)

    def ref_loss(q_, k_, v_, wp_, wt_):
        out = reference.hstu_attention(q_, k_, v_, Tensor(offsets), Tensor(ts), wp_, wt_, n, Tensor(req))
        return (out * Tensor(dout)).sum(), out

    grad_fn = ms.value_and_grad(ref_loss, grad_position=(0, 1, 2, 3, 4), has_aux=True)
    (_, ref_out), ref_grads = grad_fn(*(Tensor(x) for x in (q, k, v, w_pos, w_ts)))
    ref_out = ref_out.asnumpy()
    for workers in (1, 3, 8):
        out = emulate(q, k, v, offsets, ts, req, w_pos, w_ts, n, workers)
        assert np.isfinite(out).all()
        np.testing.assert_allclose(out, ref_out, rtol=0, atol=2e-5 * np.abs(ref_out).max())
        _, grads = emulate(q, k, v, offsets, ts, req, w_pos, w_ts, n, workers, dout=dout)  # backward plan only
        for got, want in zip(grads, ref_grads):
            want = want.asnumpy()
            assert np.isfinite(got).all()
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(np.abs(want).max(), 1e-6))
