"""Turns a validated sample into (token ids, loss mask) with the model's tokenizer.

With a chat template: the rendered conversation is encoded without adding special tokens (the
template writes BOS and the turn tokens itself; this is what apply_chat_template(tokenize=True)
does), and a token's mask is 1 when its characters overlap an assistant reply's span. Each
span runs from the end of the assistant header through the reply's end-of-turn token and any
text the template puts after it before the next turn; trailing whitespace-only tokens that follow
a special token (Qwen's "\n" after <|im_end|>) are not part of the reply and get 0. A template
with {% generation %} blocks marks the spans itself, taken as they are (as transformers'
return_assistant_tokens_mask does).

Without a chat template (a base model): BOS when the tokenizer config sets add_bos_token, then
the prompt's tokens, the completion's tokens and EOS; the mask is 1 on the completion and EOS.
Chat lines need a template (a multi-turn conversation has no template-free form).
"""

import bisect

from .errors import InputError


class Masker:
    def __init__(self, model, template):
        self._tokenizer = model.tokenizer
        self._template = template  # a ChatTemplate, or None
        self._eos_id = model.eos_id
        self._bos_id = model.bos_id
        self._special_ids = model.special_ids

    def _encode(self, text):
        return self._tokenizer.encode(text, add_special_tokens=False)

    def tokenize(self, sample):
        """(ids, mask) as lists; raises InputError naming the sample's file:line."""
        if self._template is None:
            return self._without_template(sample)
        try:
            text, spans = self._template.render_with_spans(sample.messages)
        except ValueError as e:  # jinja2's TemplateError is an Exception, caught below
            raise InputError(sample.path, sample.line, "messages", str(e)) from None
        except Exception as e:  # raise_exception() in the template, or a template bug
            raise InputError(sample.path, sample.line, "messages",
                             f"the chat template refused it: {e}") from None
        encoding = self._encode(text)
        ids = encoding.ids
        offsets = encoding.offsets
        mask = [0] * len(ids)
        # Offsets are non-decreasing, so the tokens overlapping a span are one run of indices.
        token_starts = [s for s, _ in offsets]
        token_ends = [e for _, e in offsets]
        for start, end in spans:
            first = bisect.bisect_right(token_ends, start)
            last = bisect.bisect_left(token_starts, end)
            chosen = [t for t in range(first, last) if offsets[t][1] > offsets[t][0]]
            # Whitespace after the reply's last special token belongs to the template's layout
            # (a {% generation %} block is taken as the template marks it, as transformers does).
            while (not self._template.has_generation_tags and len(chosen) > 1
                   and ids[chosen[-1]] not in self._special_ids
                   and not text[offsets[chosen[-1]][0]:offsets[chosen[-1]][1]].strip()
                   and any(ids[t] in self._special_ids for t in chosen[:-1])):
                chosen.pop()
            for t in chosen:
                mask[t] = 1
        if not any(mask):
            raise InputError(sample.path, sample.line, "messages",
                             "the rendered conversation has no assistant tokens")
        return ids, mask

    def _without_template(self, sample):
        if sample.format == "chat":
            raise InputError(sample.path, sample.line, "messages",
                             "the model directory has no chat_template; chat lines need one "
                             "(use prompt/completion lines for a base model)")
        if self._eos_id is None:
            raise InputError(sample.path, sample.line, None,
                             "the model directory names no eos token (tokenizer_config.json "
                             "eos_token or generation_config.json eos_token_id) to end the "
                             "completion with")
        prompt = ([self._bos_id] if self._bos_id is not None else []) + \
            self._encode(sample.prompt).ids
        completion = self._encode(sample.completion).ids + [self._eos_id]
        return prompt + completion, [0] * len(prompt) + [1] * len(completion)
