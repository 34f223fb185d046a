"""Rendered launch scripts: exact content, valid bash, and inert against injection."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from jobctl.backends import RunContext, get_backend
from jobctl.templates import env_name, shell_quote


def _ctx(run_dir: Path, run_id: str = "quick-1", **kw) -> RunContext:
    return RunContext(
        run_id=run_id,
        run_dir=run_dir,
        nnodes=2,
        nproc_per_node=[2, 2],
        rdzv_endpoint="127.0.0.1:29400",
        python="/usr/bin/python3",
        **kw,
    )


def test_local_scripts_exact(tmp_path):
    r = get_backend("local").render(_ctx(Path("/runs/quick-1")))
    assert sorted(r.files) == ["node-0.sh", "node-1.sh"]
    text = r.files["node-1.sh"]
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "node 1 of 2" in text
    assert "export JOBCTL_RUN_DIR=/runs/quick-1\n" in text
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1\n" in text
    assert "\n/usr/bin/python3 -m jobctl.engine.worker.agent \\\n" in text
    assert "  --nproc-per-node=2 \\\n" in text
    assert "  --rdzv-endpoint=127.0.0.1:29400 \\\n" in text
    assert "  --rdzv-conf=is_host=false \\\n" in text
    assert '  --rdzv-id="$rdzv_id" \\\n' in text
    assert "  -m jobctl.engine.worker.process &\n" in text


@pytest.mark.skipif(
    not shutil.which("shellcheck"), reason="shellcheck not installed (apt-get install shellcheck)"
)
def test_scripts_pass_bash_n_and_shellcheck(tmp_path):
    r = get_backend("local").render(_ctx(tmp_path))
    paths = r.write(tmp_path / "scripts")
    assert [p.name for p in paths] == ["node-0.sh", "node-1.sh"]
    for path in paths:
        subprocess.run(["bash", "-n", str(path)], check=True)
        subprocess.run(["shellcheck", str(path)], check=True)


def test_metacharacters_stay_inert(tmp_path):
    marker = tmp_path / "pwned"
    evil = f"x'; touch {marker}; echo '$(touch {marker})`touch {marker}`"
    ctx = _ctx(tmp_path / evil.replace("/", "_"), env={"USER_NOTE": evil})
    r = get_backend("local").render(ctx)
    script = tmp_path / "node-0.sh"
    python = '/usr/bin/python3() { echo /usr/bin/python3 "$@"; }\n'
    script.write_text(r.files["node-0.sh"].replace("pipefail\n", "pipefail\n" + python, 1))
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True)
    assert not marker.exists()
    assert "--rdzv-id=quick-1" in out.stdout


def test_quote_and_env_name():
    assert shell_quote("a b") == "'a b'"
    assert shell_quote("plain") == "plain"
    with pytest.raises(ValueError, match="invalid environment variable name"):
        env_name("A;rm -rf /")


def test_unknown_backend_lists_valid_names():
    with pytest.raises(ValueError, match="valid backends are local"):
        get_backend("nomad")
