"""The GPU benchmark scripts run on a CPU too: a quick smoke run of each."""

import pathlib

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch):
  monkeypatch.syspath_prepend(str(BENCHMARKS))


@pytest.mark.slow
def test_step_time_quick_run_gives_a_table_with_the_copy_rate():
  import step_time

  result = step_time.main(["--quick"])
  table = step_time.format_table(result)
  assert "| `lars_optax.lars(momentum=0.9)` |" in table and "of copy rate" in table
  rows = {r["optimizer"]: r for r in result["rows"]}
  # params, grads and the momentum: 2 * P + G + 2 * M bytes, P = G = M.
  assert rows["optax.sgd(momentum=0.9)"]["bytes"] == 5 * 4 * result["parameters"]
  assert result["copy_GBps"] > 0 and result["steps_per_call"] == 2


@pytest.mark.slow
def test_step_time_bfloat16_counts_half_the_bytes():
  import step_time

  result = step_time.main(["--quick", "--dtype", "bfloat16", "--only", "optax.sgd",
                           "--rounds", "1"])
  rows = {r["optimizer"]: r for r in result["rows"]}
  assert rows["optax.sgd(momentum=0.9)"]["bytes"] == 5 * 2 * result["parameters"]


@pytest.mark.slow
def test_grouped_leaves_quick_run_checks_and_times_the_grouped_step():
  import grouped_leaves

  report = grouped_leaves.main(["--quick"])
  assert "| grouped: LARS, leaf index by binary search |" in report


@pytest.mark.slow
def test_grouped_leaves_by_shape_quick_run_checks_the_stacked_steps_and_counts_kernels():
  import grouped_leaves

  # The run first checks that the stacked LAMB and LARS steps equal the per-leaf ones.
  report = grouped_leaves.main(["--by-shape", "--quick"])
  row = next(line for line in report.splitlines()
             if line.startswith("| by shape, indexed: lamb(wd) |"))
  per_leaf = next(line for line in report.splitlines()
                  if line.startswith("| per leaf: lars_optax.lamb(wd) |"))
  # Fewer kernels per leaf when the leaves of a shape are one stack.
  assert float(row.split("|")[2]) < float(per_leaf.split("|")[2])


@pytest.mark.slow
def test_train_step_time_quick_run_times_the_three_optimizers():
  import train_step_time

  result = train_step_time.main(["--quick"])
  assert [r["optimizer"] for r in result["rows"]] == [
      "optax.sgd(momentum=0.9)", "optax.lars", "lars_optax.lars"]
  assert all(r["train_ms"] > 0 and r["alone_ms"] > 0 for r in result["rows"])


@pytest.mark.slow
def test_sparse_whole_model_quick_run_gives_each_pair_its_compile_and_step_ratios():
  import sparse_whole_model

  result = sparse_whole_model.main(["--quick", "--only", "sgd", "--vocab", "512"])
  rows = {r["optimizer"]: r for r in result["rows"]}
  assert set(rows) == {"optax.sgd", "sparse.sgd(sparse='embedding')"}
  assert rows["optax.sgd"]["compile_ratio"] == 1.0 and rows["optax.sgd"]["step_ratio"] == 1.0
  exact = rows["sparse.sgd(sparse='embedding')"]
  assert exact["compile_s"] > 0 and exact["step_ratio"] > 0
  assert "medians of 1 compile and 3 steps a row" in sparse_whole_model.format_table(result)


@pytest.mark.slow
def test_stacked_layers_quick_run_compares_stacked_with_unrolled():
  import stacked_layers

  result = stacked_layers.main(["--quick"])
  variants = {r["variant"] for r in result["rows"]}
  assert variants == {"unrolled", "stacked", "one norm per stack"}
  assert result["leaves"] == {"unrolled": 3 * 12 + 3, "stacked": 12 + 3}
  assert "| `lars` |" in stacked_layers.format_table(result)


@pytest.mark.slow
def test_step_time_scaling_quick_run_counts_kernels_per_leaf():
  import step_time

  result = step_time.main(["--scaling", "--quick"])
  rows = {(r["optimizer"], r["leaves"]): r for r in result["rows"]}
  assert {leaves for _, leaves in rows} == {12, 24}
  sgd = rows[("optax.sgd(momentum=0.9)", 24)]
  ours = rows[("lars_optax.lars(momentum=0.9, skip='flax')", 24)]
  peer = rows[("optax.lars", 24)]
  assert sgd["launches_per_leaf"] >= 1 and sgd["step_ratio"] == 1.0
  # The per-leaf scalar work is folded into few kernels: fewer launches than optax's.
  assert ours["launches_per_leaf"] < peer["launches_per_leaf"]
  # Stacked by shape: fewer launches again.
  stacked = rows[("lars_optax.lars(momentum=0.9, skip='flax', group_by_shape=True)", 24)]
  assert stacked["launches_per_leaf"] < ours["launches_per_leaf"]
  assert result["copy_GBps"] > 0 and all(r["bytes"] > 0 for r in result["rows"])
  table = step_time.format_scaling(result)
  assert "| kernels / leaf |" in table and "| of copy rate |" in table


@pytest.mark.parametrize("floor, ours", [
    ("hand_written_lars", "lars_optax.lars(momentum=0.9, skip='flax')"),
    ("hand_written_lamb", "lars_optax.lamb(wd)"),
])
def test_hand_written_floors_take_the_steps_of_the_rows_they_bound(floor, ours):
  """A floor is a bound only if it computes what our row computes."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import step_time

  params = step_time.transformer_tree(1, 16)
  grads = jax.tree.map(lambda p: 0.3 * p + 0.01, params)
  lr = 0.1 if "lars" in floor else 1e-3
  after = []
  for tx in (step_time.SCALING[ours](), getattr(step_time, floor)(lr)):
    p = jax.tree.map(jnp.copy, params)
    state, step = tx.init(p), step_time.make_step(tx)  # the benchmark's step, donating
    for _ in range(3):
      p, state = step(p, state, grads)
    after.append(p)
  for name in params:
    np.testing.assert_allclose(after[1][name], after[0][name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_tpu_scaling_table_counts_entry_fusions_and_gives_ratios_to_sgd():
  import step_time

  hlo = """HloModule m

%fused_computation (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %inner = f32[4]{0} fusion(%p), kind=kLoop, calls=%other
  ROOT %n = f32[4]{0} negate(%p)
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %cs = (f32[4]{0}, f32[4]{0}, u32[]) copy-start(%a)
  %f1 = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused_computation
  ROOT %f2 = f32[4]{0} fusion(%f1), kind=kLoop, calls=%fused_computation
}
"""
  assert step_time.entry_fusions(hlo) == 2
  rows = [{"optimizer": "optax.sgd(momentum=0.9)", "leaves": 12, "compile_s": 0.5,
           "cycles": 1000, "fusions_per_leaf": 2.0},
          {"optimizer": "lars_optax.lamb(wd)", "leaves": 12, "compile_s": 1.5,
           "cycles": 2500, "fusions_per_leaf": 6.25}]
  table = step_time.format_scaling_tpu({"device": "TPU v5e:2x2 (one chip, cost model)",
                                        "jax": "0", "optax": "0", "hidden": 16, "compiles": 1,
                                        "rows": rows})
  assert "| `lars_optax.lamb(wd)` | 12 | 6.25 | 1.50 | 3.0 | 2.50 |" in table
  with pytest.raises(SystemExit):  # --tpu belongs to the scaling table
    step_time.main(["--tpu", "v5e:2x2"])


def test_launches_counts_the_entry_computation_and_what_it_calls():
  import step_time

  hlo = """HloModule m

%fused_computation (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}

%command_buffer (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %f1 = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused_computation
  ROOT %f2 = f32[4]{0} fusion(%f1), kind=kLoop, calls=%fused_computation
}

ENTRY %main (x: f32[4]) -> (f32[4], f32[4]) {
  %x = f32[4]{0} parameter(0)
  %c = f32[] constant(1)
  %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_computation
  %cb = f32[4]{0} call(%f), to_apply=%command_buffer
  %copy = f32[4]{0} copy(%cb)
  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%cb, %copy)
}
"""
  assert step_time.launches(hlo) == 4  # f, the two fusions of the buffer, the copy
