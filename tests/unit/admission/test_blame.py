"""Whose doing an upstream error is: the client's errors never count against the replica."""

import json

import pytest

from tidegate.admission.blame import client_caused


def body(doc: object) -> bytes:
    return json.dumps(doc).encode()


def llamacpp(message: str, kind: str = "server_error", code: int = 500) -> bytes:
    """llama.cpp's error answer (format_error_response in tools/server/server-common.cpp, 0c1e570)."""
    return body({"error": {"code": code, "message": message, "type": kind}})


@pytest.mark.parametrize(
    ("status", "answer"),
    [
        (500, llamacpp("Failed to parse tools: [json.exception.type_error.302] type must be array, but is string")),
        (500, llamacpp("[json.exception.type_error.302] type must be string, but is number")),
        (500, llamacpp("Failed to parse tools: Missing tool type: {}; tools = [\n  {}\n]")),  # measured
        (500, llamacpp("Failed to parse messages: [json.exception.out_of_range.403] key 'text' not found")),
        (500, llamacpp("tools param requires --jinja flag")),
        (500, llamacpp('"prompt" must not be empty')),
        (500, llamacpp("Unknown reasoning format: bogus")),  # measured: chat with "reasoning_format": "bogus"
        # measured: a lazy grammar with an empty trigger pattern (the client's grammar rejects a token)
        (500, llamacpp("got exception: Unexpected empty grammar stack after accepting piece: - (29)")),
        (501, llamacpp("This server does not support embeddings.", "not_supported_error", 501)),
        (500, body({"object": "error", "message": "bad n", "type": "BadRequestError", "code": 400})),  # older vLLM
        (500, body({"error": {"message": "bad n", "type": "BadRequestError", "param": None, "code": 400}})),
        (500, body({"error": "Input validation error: `inputs` must not be empty", "error_type": "validation"})),  # TGI
        (400, b"anything"),
        (429, b""),
    ],
)
def test_errors_the_request_caused_are_the_clients(status: int, answer: bytes) -> None:
    assert client_caused(status, answer)


@pytest.mark.parametrize(
    ("status", "answer"),
    [
        (500, llamacpp("Compute error.")),
        (500, llamacpp("context shift is disabled")),
        (500, llamacpp("got exception: std::bad_alloc")),
        (503, llamacpp("Loading model", "unavailable_error", 503)),
        (500, body({"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}})),
        (500, body({"error": "Request failed during generation: Server error", "error_type": "generation"})),  # TGI
        (500, b"Internal Server Error"),
        (502, b"<html>bad gateway</html>"),
        (500, b""),
        (500, body(["not", "an", "object"])),
        (500, body({"error": {"message": "x", "type": ["unhashable"], "code": True}})),
    ],
)
def test_everything_else_is_the_replicas(status: int, answer: bytes) -> None:
    assert not client_caused(status, answer)
