"""Which paths are admitted, refused or passed through (the bypass through a model server's own routes)."""

import pytest

from tidegate.admission import paths
from tidegate.admission.cost import CHAT_PATH, COMPLETIONS_PATH


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("/chat/completions", CHAT_PATH), ("/v1/chat/completions/", CHAT_PATH), ("/V1/CHAT/completions", CHAT_PATH),
     ("/v1/chat%2Fcompletions", CHAT_PATH), ("/v1/completions", COMPLETIONS_PATH), ("/completions", None),
     ("/v1/models", None)],
)  # fmt: skip
def test_spellings_of_the_admitted_paths_are_admitted_as_them(raw: str, expected: str | None) -> None:
    assert paths.admitted_as("POST", raw) == expected
    assert paths.admitted_as("GET", raw) is None


@pytest.mark.parametrize(
    "raw", ["/generate", "/GENERATE/", "/generate%5Fstream", "/", "/completion", "/completions", "/infill",
            "/v1/responses", "/invocations", "/v2/models/llama/versions/1/infer"],
)  # fmt: skip
def test_generation_routes_are_refused_for_methods_that_can_generate(raw: str) -> None:
    assert paths.refused("POST", raw) and paths.refused("PUT", raw)
    assert not paths.refused("GET", raw) and not paths.refused("HEAD", raw)


@pytest.mark.parametrize(
    "raw", ["/tokenize", "/v1/models", "/health", "/v1/embeddings", "/v1/responses/r1/cancel", "/v2/models/m"]
)
def test_other_routes_are_not_refused(raw: str) -> None:
    assert not paths.refused("POST", raw)


def test_the_refusal_names_the_paths_to_use() -> None:
    message = paths.refusal_message("POST", "/generate")
    assert "/generate" in message and CHAT_PATH in message and COMPLETIONS_PATH in message
