"""Renders a conversation with an HF chat template the way transformers 4.55 does, and finds the
character spans of the assistant replies in the rendered text.

The environment matches transformers' chat-template environment: jinja2's immutable sandbox with
trim_blocks and lstrip_blocks, the loop-controls extension, a `tojson` filter that leaves non-ASCII
(and HTML characters) as they are and accepts indent / separators / sort_keys, the globals
`raise_exception` (raises a TemplateError with the template's message) and `strftime_now`
(today's date in a format), and the `{% generation %}` block tag. The variables are the messages,
add_generation_prompt, tools and documents (None here) and the special-token strings.

Reply spans: when the template marks replies with {% generation %} ... {% endgeneration %} those
blocks are the spans. Otherwise a reply's span runs from the end of the conversation rendered up
to it with add_generation_prompt=True (which ends with the assistant header) to the end of the
conversation rendered up to and including it; both renderings must be prefixes of the whole one,
or the template rewrites earlier turns and the span cannot be found (an error, not a guess).
"""

import json
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _GenerationTag(Extension):
    """{% generation %}...{% endgeneration %}: renders its body and, while a recorder is set,
    records the body's [start, end) in the output rendered so far."""

    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        environment.extend(generation_recorder=None)

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_record", []), [], [], body).set_lineno(lineno)

    def _record(self, caller):
        text = caller()
        recorder = self.environment.generation_recorder
        if recorder is not None:
            recorder.mark(len(text))
        return text


class _Recorder:
    """Counts the characters the template has emitted so far; collects generation spans."""

    def __init__(self):
        self.emitted = 0
        self.spans = []

    def mark(self, length):
        # Called when the block's output is produced, before it is yielded: it starts here.
        self.spans.append((self.emitted, self.emitted + length))


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source, special_tokens):
        # One environment per template: the generation recorder lives on it.
        self._env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
        self._env.filters["tojson"] = _tojson
        self._env.globals["raise_exception"] = _raise_exception
        self._env.globals["strftime_now"] = _strftime_now
        self._template = self._env.from_string(source)  # TemplateSyntaxError to the caller
        self._special = dict(special_tokens)
        self.has_generation_tags = self._uses_generation(source)

    def _uses_generation(self, source):
        # The tag, not a variable that happens to be called "generation".
        previous = None
        for _, kind, value in self._env.lex(source):
            if kind == "name" and value == "generation" and previous == "block_begin":
                return True
            if kind != "whitespace":
                previous = kind
        return False

    def _variables(self, messages, add_generation_prompt):
        # transformers: {**special_tokens_map, **kwargs}, then messages, tools, documents and
        # add_generation_prompt as the render's own arguments.
        variables = dict(self._special)
        variables.update(messages=messages, tools=None, documents=None,
                         add_generation_prompt=add_generation_prompt)
        return variables

    def render(self, messages, add_generation_prompt=False):
        return self._template.render(**self._variables(messages, add_generation_prompt))

    def render_with_spans(self, messages):
        """(text, [(start, end)]) of the whole conversation and its assistant replies (chars)."""
        if self.has_generation_tags:
            recorder = _Recorder()
            self._env.generation_recorder = recorder
            try:
                parts = []
                for chunk in self._template.generate(**self._variables(messages, False)):
                    parts.append(chunk)
                    recorder.emitted += len(chunk)
            finally:
                self._env.generation_recorder = None
            return "".join(parts), recorder.spans
        text = self.render(messages)
        spans = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            head = self.render(messages[:i], add_generation_prompt=True)
            upto = self.render(messages[: i + 1])
            if not (upto.startswith(head) and text.startswith(upto)):
                raise ValueError(
                    f"messages[{i}]: the chat template renders the conversation before this "
                    "reply differently once the reply (or later turns) follow, so the reply's "
                    "tokens cannot be located; use a template with {% generation %} blocks")
            spans.append((len(head), len(upto)))
        return text, spans
