"""A Qwen2.5-style ChatML chat template with tools, tool calls, tool results and reasoning.

The template follows Qwen2.5-Instruct's layout (tool signatures in the system turn, ``<tool_call>`` blocks
in assistant turns, ``<tool_response>`` blocks inside user turns) with two deliberate differences:

* ``reasoning_content`` is rendered as ``<think>\\n...\\n</think>\\n\\n`` on *every* assistant turn that
  has it. Qwen3 drops reasoning from turns before the last user query, which makes rendering not
  append-only; RL prefix merging needs rendering ``messages[:k]`` with a generation prompt to be a prefix
  of rendering any longer conversation whose next message is the assistant's.
* Tool-call ``arguments`` given as a JSON string (the OpenAI wire format) are emitted verbatim instead of
  being JSON-encoded a second time; mappings are encoded with ``tojson``.

Message ``content`` may be a string, ``None`` or a list of OpenAI-style parts (text parts are joined).

Append-only holds at the token level too, with one exception shared with every Qwen2 tokenizer: an
assistant message whose text starts with a newline (and has no reasoning) merges that newline with the
one after ``<|im_start|>assistant``, because Qwen2's split regex groups runs of newlines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

CHATML_TOOLS_TEMPLATE = (
    """\
{%- macro render_content(content) -%}
    {%- if content is none -%}
    {%- elif content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part.type == 'text' -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set system_content = render_content(messages[0].content) -%}
{%- else -%}
    {%- set system_content = '"""
    + DEFAULT_SYSTEM_PROMPT
    + """' -%}
{%- endif -%}
{{- '<|im_start|>system\\n' + system_content -}}
{%- if tools -%}
    {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' -}}
    {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' -}}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- for message in messages -%}
    {%- if message.role == 'system' -%}
        {%- if not loop.first -%}
            {{- '<|im_start|>system\\n' + render_content(message.content) + '<|im_end|>\\n' -}}
        {%- endif -%}
    {%- elif message.role == 'user' -%}
        {{- '<|im_start|>user\\n' + render_content(message.content) + '<|im_end|>\\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\\n' -}}
        {%- if message.reasoning_content -%}
            {{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' -}}
        {%- endif -%}
        {%- set content = render_content(message.content) -%}
        {{- content -}}
        {%- if message.tool_calls -%}
            {%- for tool_call in message.tool_calls -%}
                {%- if tool_call.function is defined -%}
                    {%- set tool_call = tool_call.function -%}
                {%- endif -%}
                {%- if content or not loop.first -%}
                    {{- '\\n' -}}
                {%- endif -%}
                {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' -}}
                {%- if tool_call.arguments is string -%}
                    {{- tool_call.arguments -}}
                {%- else -%}
                    {{- tool_call.arguments | tojson -}}
                {%- endif -%}
                {{- '}\\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\\n' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\\n' -}}
{%- endif -%}
"""
)
"""Jinja chat template (Qwen2.5 layout, append-only); see the module docstring."""

_PROBE_TOOL_NAME = "polar_probe_tool_7f3a"


def chat_template_renders_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Report whether ``tokenizer``'s own chat template renders tool definitions.

    Args:
        tokenizer: A tokenizer with a chat template.

    Returns:
        True if rendering a one-message conversation with a probe tool mentions the tool's name. Templates
        that ignore ``tools`` (SmolLM2's, for one) return False; use :data:`CHATML_TOOLS_TEMPLATE` for them.
    """
    probe_tool = {
        "type": "function",
        "function": {
            "name": _PROBE_TOOL_NAME,
            "description": "Probe.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[probe_tool], add_generation_prompt=True, tokenize=False
    )
    return isinstance(rendered, str) and _PROBE_TOOL_NAME in rendered
