"""`ptc bench` runs and writes every figure it promises (speed is measured there, never
asserted here: these machines are noisy)."""

import json
import math

from conftest import run_ptc


def test_bench_smoke_tiny_writes_all_figures(tmp_path):
    """`--smoke` runs every section of `ptc bench --quick` at the least work (the same code,
    fewer repeats and points), so the CI benchmark's every figure is produced here."""
    out = tmp_path / "results.json"
    result = run_ptc("bench", "--smoke", "--size", "tiny", "--out", out)
    assert result.returncode == 0, result.stderr
    results = json.loads(out.read_text())
    assert results["effort"] == "smoke" and results["effort_config"]["latency_repeats"] == 20
    assert {"machine", "bank_build", "solve", "compile", "latency", "routes", "scaling"} <= set(
        results
    )
    figures = [
        results["bank_build"]["ratio_to_floor"],
        results["solve"]["paper_size"]["speedup_vs_svd_per_operator"],
        results["compile"]["warm_no_export_seconds"],
        results["latency"]["edited_over_base"],
        results["routes"]["adapter_over_closed_form"],
    ]
    assert all(math.isfinite(f) and f > 0 for f in figures)
    sections = results["section_seconds"]  # where the bench's own time goes, each section timed
    assert set(sections) == {"bank_build", "solve", "compile", "latency", "routes", "scaling"}
    assert all(seconds > 0 for seconds in sections.values())
    # A fitted exponent of millisecond timings: finite, but its sign is noise on a loaded machine.
    assert math.isfinite(results["scaling"]["solve"]["N"]["exponent"])
    assert results["compile"]["warm_rebuild"]["grid_embeddings_computed"] == 0
    # 2 sources x 4 tasks on 1 target
    assert results["bank_build"]["counts"]["operators_solved"] == 8
    assert "bank build / forward floor" in result.stdout


def test_the_real_size_benchmark_measures_every_goal_at_tiny_cost():
    """`ptc bench --size vit-b16`'s mechanism on the 2-layer vit-tiny16 (real tokenizer, 224 px),
    on 16 probes: every figure the issue asks for, and what the warm rebuild reused."""
    from ptc.lab.benchmarks import real_size

    results = real_size.run("vit-tiny16", echo=lambda line: None, probes=16)
    floors = results["forward_floors"]
    assert set(floors) == {"torch_fp32", "onnxruntime_fp32", "torch_bf16"}
    for floor in floors.values():
        assert floor["input_pass_seconds"] < floor["seconds"]
        assert math.isclose(
            floor["images_per_second"], floor["inputs_timed"] / floor["input_pass_seconds"]
        )
    # GFLOP/s from the tower's FLOPs per image, counted by torch: the same in every row
    flops = {f["gflops_per_second"] / f["images_per_second"] for f in floors.values()}
    assert max(flops) - min(flops) < 1e-9 * max(flops) and min(flops) > 0
    # the build's own choice, measured on its first build and recorded
    (measured,) = results["cold_build"]["runtime_measured"]
    assert results["cold_build"]["runtime"] == measured["chosen"]
    assert min(measured["images_per_second"].values()) > 0
    assert results["forward_floor_seconds"] == min(
        floors["torch_fp32"]["seconds"], floors["onnxruntime_fp32"]["seconds"]
    )
    for figure in (
        results["cold_build"]["embed_over_fastest_fp32_floor"],
        results["cold_build"]["non_embed_over_embed"],
        results["cold_build"]["export_base_seconds"],
        results["cold_build"]["ratio_to_forward_floor"],
        results["warm_rebuild"]["seconds"],
        results["warm_rebuild"]["ratio_to_own_floor"],
        results["peak_rss_over_model_bytes"],
        results["export"]["edited_over_base_latency"],
    ):
        assert math.isfinite(figure) and figure > 0
    # the patched graph is a fresh export's
    assert results["export"]["max_abs_diff_vs_fresh_export"] <= 1e-6
    # the base towers were exported once ...
    assert results["cold_build"]["cache"]["onnx_towers_patched"] == 1
    assert results["warm_rebuild"]["cache"] == {
        "embeddings_computed": 0,
        "factors_computed": 0,
        "operators_solved": 0,
        "check_references_computed": 0,
        "onnx_towers_patched": 1,
        "onnx_towers_reused": 1,
    }  # ... and reused on the rebuild
    assert results["verification"]["reload_max_abs_diff"] == 0.0
    # the cold build on cached exports embedded and solved again, and exported nothing afresh
    recold = results["cold_build_cached_export"]
    assert recold["cache"]["embeddings_computed"] == 1 and recold["cache"]["operators_solved"] == 1
    assert recold["cache"]["onnx_towers_patched"] + recold["cache"]["onnx_towers_reused"] == 2
    assert math.isfinite(recold["non_embed_over_embed"]) and recold["non_embed_over_embed"] > 0
    rows = dict((name, measured) for name, measured, _ in real_size.summary_rows(results))
    assert (
        "cold build / fastest fp32 forward floor" in rows and "patched ONNX vs fresh export" in rows
    )


def test_bench_refuses_two_efforts_and_an_effort_at_real_size():
    both = run_ptc("bench", "--quick", "--smoke", "--size", "tiny")
    assert both.returncode == 2
    assert "--quick and --smoke each set the effort" in both.stderr
    real = run_ptc("bench", "--smoke", "--size", "vit-b16")
    assert real.returncode == 2
    assert "--size vit-b16 runs its one real-size measurement" in real.stderr
