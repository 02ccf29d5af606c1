"""The sim-backend's tokenizer: deterministic, dependency-free, ~4 characters per token.

Real tokenizers need model files; the simulated server only needs a count that is stable,
cheap and the same everywhere it is asked (the completion endpoints, ``/tokenize``, and any
test that wants to predict ``usage.prompt_tokens``). The rule:

- text is cut into chunks of :data:`CHARS_PER_TOKEN` Unicode code points, the last chunk
  shorter; each chunk is one token, so ``count(text) == ceil(len(text) / 4)``;
- a token's id is ``crc32(chunk) % VOCAB_SIZE`` (ids look like a Llama-3 vocabulary's and
  are the same on every run and machine);
- chat messages are rendered through a fixed template (:func:`render_chat`) first, so a chat
  request costs a few tokens more than its bare contents, as with a real chat template;
- generated text is made of 4-character words (:func:`output_text`), so re-tokenising a
  completion gives back exactly ``usage.completion_tokens``.

Four characters per token is the usual rule of thumb for English with BPE vocabularies
(OpenAI's tokenizer guide: "one token generally corresponds to ~4 characters of text").

Errors: :class:`PromptError` (a ``ValueError``) for messages or prompts of the wrong shape.
"""

import math
import zlib
from collections.abc import Sequence

CHARS_PER_TOKEN = 4
VOCAB_SIZE = 128_256  # Llama 3's vocabulary size
_WORDS = (" the", " and", " for", " was", " not", " you", " but", " all", " any", " can", " had", " her", " one")


class PromptError(ValueError):
    """The prompt or messages of a request have the wrong shape (HTTP 400)."""


def count(text: str) -> int:
    """Number of tokens in ``text``: ``ceil(len(text) / 4)``; 0 for the empty string."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def tokenize(text: str) -> list[int]:
    """Token ids of ``text``; ``len(tokenize(t)) == count(t)``."""
    return [
        zlib.crc32(text[i : i + CHARS_PER_TOKEN].encode("utf-8")) % VOCAB_SIZE
        for i in range(0, len(text), CHARS_PER_TOKEN)
    ]


def _content_text(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise PromptError(f"{where}.content: only text parts are supported by sim-backend")
            parts.append(part["text"])
        return "".join(parts)
    raise PromptError(f"{where}.content must be a string or a list of text parts")


def render_chat(messages: object) -> str:
    """The prompt text of a chat request: ``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n``.

    Raises :class:`PromptError` unless ``messages`` is a non-empty list of objects with a string
    ``role`` and a string (or text-parts) ``content``.
    """
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages must be a non-empty list")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise PromptError(f"messages[{i}] must be an object with a string 'role'")
        out.append(f"<|{message['role']}|>\n{_content_text(message.get('content'), f'messages[{i}]')}\n")
    out.append("<|assistant|>\n")
    return "".join(out)


def prompt_tokens(prompt: object) -> int:
    """Token count of a ``/v1/completions`` prompt: a string, a one-element list of strings, or token ids.

    Raises :class:`PromptError` for anything else (sim-backend serves one prompt per request).
    """
    if isinstance(prompt, str):
        return count(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return count(prompt[0])
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return len(prompt)
    raise PromptError("prompt must be a string, a list of one string, or a non-empty list of token ids")


def output_text(index: int) -> str:
    """The text of generated token number ``index`` (0-based): always :data:`CHARS_PER_TOKEN` characters."""
    return _WORDS[index % len(_WORDS)]


def output_texts(start: int, stop: int) -> Sequence[str]:
    """Texts of generated tokens ``start`` .. ``stop - 1``."""
    return [output_text(i) for i in range(start, stop)]
