"""``tidegate admission`` on a port that is taken: one clear line and exit 2, not a traceback."""

import socket
import subprocess
import sys


def test_a_taken_listen_port_is_one_clear_error(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("model: {name: m, engine: llamacpp, maxContextTokens: 1024}\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "tidegate.cli.main", "admission", "--config", str(config),
             "--upstream", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{port}", "--event-loop", "asyncio"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr and "Unclosed" not in result.stderr
