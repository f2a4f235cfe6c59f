"""What a pass reads is never written to: the user's folder and shared cache entries stay as
they were, and models whose weights live in external-data files are whole models."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import onnx
import pytest

import quantune
from conftest import cnn_inputs, run_model

LITTER = "test_litter"


class LitterConfig(quantune.PassConfig):
    external: bool = False  # write the output's weights to weights/all.bin beside it


@quantune.register_pass
class LitterPass(quantune.Pass):
    """Writes a side file beside its input and removes it again, as onnxruntime's quantizers do."""

    name = LITTER
    Config = LitterConfig
    side_files: list[Path] = []

    def run(self, config, model_in, model_out, context):
        side = Path(model_in).with_name(Path(model_in).stem + "-inferred.onnx")
        shutil.copyfile(model_in, side)
        LitterPass.side_files.append(side)
        model = onnx.load(str(side))  # external data resolves beside the input
        side.unlink()
        if config.external:
            (Path(model_out).parent / "weights").mkdir()
            onnx.save(model, str(model_out), save_as_external_data=True, location="weights/all.bin", size_threshold=0)
        else:
            onnx.save(model, str(model_out))


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def test_side_files_of_a_pass_never_land_beside_the_users_model_or_a_cached_one(make_config, tmp_path, cnn_model):
    user = tmp_path / "user"
    user.mkdir()
    model = user / "model.onnx"
    shutil.copyfile(cnn_model, model)
    before = _listing(user)
    LitterPass.side_files.clear()
    config = make_config(
        passes=[{"name": LITTER}, {"name": LITTER, "id": "again"}, {"name": "dynamic_quant"}],
        model=str(model),
        cache_dir=str(tmp_path / "cache"),
    )
    result = quantune.tune(config, output=tmp_path / "out")
    assert [t.status for t in result.trials] == ["ok"]
    assert _listing(user) == before
    cache_models = tmp_path / "cache" / "models"
    for side in LitterPass.side_files:
        assert cache_models not in side.parents and user not in side.parents, side
    for entry in cache_models.iterdir():
        assert sorted(os.listdir(entry)) == ["meta.json", "model.onnx"], entry


def _save_with_external_data(source: Path, folder: Path) -> Path:
    (folder / "weights").mkdir(parents=True)
    model = onnx.load(str(source))
    target = folder / "model.onnx"
    onnx.save(model, str(target), save_as_external_data=True, location="weights/all.bin", size_threshold=0)
    assert (folder / "weights" / "all.bin").is_file()
    return target


def test_a_model_with_external_data_is_tuned_hashed_and_written_whole(make_config, tmp_path, cnn_model):
    model = _save_with_external_data(cnn_model, tmp_path / "user")
    config = make_config(
        passes=[{"name": "graph_opt"}],
        model=str(model),
        objective="size",
        cache_dir=str(tmp_path / "cache"),
    )
    result = quantune.tune(config, output=tmp_path / "out")
    assert [t.status for t in result.trials] == ["ok"]
    # size counts the weights file, not only the small graph file
    assert result.baseline["size_bytes"] > 2 * model.stat().st_size

    # a change to the weights alone is a different model: no stale cached evaluation
    weights = tmp_path / "user" / "weights" / "all.bin"
    data = bytearray(weights.read_bytes())
    data[: len(data) // 2] = bytes(len(data) // 2)
    weights.write_bytes(bytes(data))
    again = quantune.tune(config, output=tmp_path / "out2")
    assert again.baseline["top1"] != result.baseline["top1"] or again.baseline["cosine"] != result.baseline["cosine"]
    assert again.trials[0].cache["graph_opt"] == "miss"


def test_a_pass_output_with_external_data_is_cached_and_written_whole(make_config, tmp_path, cnn_model):
    model = _save_with_external_data(cnn_model, tmp_path / "user")
    config = make_config(  # QOperator int8 is smaller: an improved verdict on size writes best/
        passes=[
            {"name": "static_quant", "params": {"quant_format": "QOperator"}},
            {"name": LITTER, "params": {"external": True}},
        ],
        model=str(model),
        objective="size",
        cache_dir=str(tmp_path / "cache"),
    )
    first = quantune.tune(config, output=tmp_path / "out")
    assert first.trials[0].status == "ok" and first.trials[0].meets_criterion
    assert first.verdict == "improved"
    best = tmp_path / "out" / "best" / "model.onnx"
    assert (best.parent / "weights" / "all.bin").is_file()
    x = cnn_inputs(4, seed=3)
    assert run_model(best, {"input": x})[0] == pytest.approx(run_model(first.trials[0].model_path, {"input": x})[0])

    # the cached entry holds the weights too, and a damaged weights file is a miss, not a hit
    (entry,) = (e for e in (tmp_path / "cache" / "models").iterdir() if (e / "weights").exists())
    assert (entry / "weights" / "all.bin").is_file()
    (entry / "weights" / "all.bin").write_bytes(b"\0" * 16)
    again = quantune.tune(config, output=tmp_path / "out2")
    assert again.trials[0].cache[LITTER] == "miss"
    assert again.trials[0].metrics["top1"] == first.trials[0].metrics["top1"]
