"""A model for ADK agents that answers from a script and remembers what it was asked:
real `Runner` turns without a network (no model is mocked inside ADK; this is a model)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types
from pydantic import ConfigDict, Field


class ScriptedModel(BaseLlm):  # type: ignore[misc]
    """Answers `replies` in turn ("ok" once they run out). `asked` holds the texts of
    each request's conversation; a set `gate` is awaited before answering."""

    replies: list[str] = Field(default_factory=list)
    asked: list[list[str]] = Field(default_factory=list)
    gate: asyncio.Event | None = None

    model_config = ConfigDict(arbitrary_types_allowed=True)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.asked.append(
            [
                part.text
                for content in llm_request.contents
                for part in content.parts or []
                if part.text
            ]
        )
        if self.gate is not None:
            await self.gate.wait()
        text = self.replies.pop(0) if self.replies else "ok"
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))
