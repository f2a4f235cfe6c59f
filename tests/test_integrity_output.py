"""An output folder holding quantune's file names but no quantune run is never overwritten unasked."""

from __future__ import annotations

import yaml

from quantune.cli import main


def test_a_folder_with_results_and_a_best_model_but_no_run_is_refused(make_config, tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(make_config(stop={"max_trials": 1})))
    out = tmp_path / "theirs"
    (out / "best").mkdir(parents=True)
    (out / "results.json").write_text('{"mine": true}\n')
    (out / "best" / "model.onnx").write_bytes(b"the user's model")

    assert main(["run", str(config), "--output", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(out) in err and "--restart" in err and "another --output" in err
    assert (out / "results.json").read_text() == '{"mine": true}\n'
    assert (out / "best" / "model.onnx").read_bytes() == b"the user's model"
    assert sorted(p.name for p in out.iterdir()) == ["best", "results.json"], "nothing of the run is left there"

    assert main(["run", str(config), "--output", str(out), "--quiet", "--restart"]) == 0, "asked: replaced"
    assert (out / "run.db").is_file() and (out / "results.json").read_text() != '{"mine": true}\n'
    assert main(["run", str(config), "--output", str(out), "--quiet"]) == 0, "now a run of ours: it resumes"
