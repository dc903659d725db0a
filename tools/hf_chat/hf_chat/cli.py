"""megatrain_chat_tokenize: JSONL (chat, prompt/completion, Alpaca) -> an MTSFT sample-set file.

Contract for a calling process: on success exit 0 and one JSON line on stdout (the summary); on
bad input lines exit 1, each error on stderr as "FILE:LINE: field F: what" (at most
--max_errors, then a count), and no output file; on a bad model directory, usage or an I/O error
exit 2 with one line on stderr. Nothing but the summary is ever written to stdout.
"""

import argparse
import json
import os
import sys

import jinja2
import tokenizers

from . import chat_io, model_dir
from .errors import InputError, ModelError
from .masking import Masker
from .records import FORMATS, Limits, read_samples
from .sample_file import SampleSetWriter
from .template import ChatTemplate

EXIT_OK, EXIT_BAD_INPUT, EXIT_FAILED = 0, 1, 2

# Bump whenever the file written for the same model directory and JSONL changes (rendering,
# masking, mapping of the formats, the file format): a caller that caches sample-set files by
# their inputs' hashes (as the daemon does token files) keys them by this too.
OUTPUT_VERSION = 1


class _Usage(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would exit 2 with its own text; same code, one line
        raise _Usage(message)


def _parser():
    p = _Parser(prog="megatrain_chat_tokenize", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF model directory (tokenizer.json, "
                   "tokenizer_config.json with chat_template)")
    p.add_argument("--out", required=True, help="the MTSFT file to write (replaced atomically)")
    p.add_argument("--format", default="auto", choices=("auto",) + FORMATS,
                   help="the lines' format; auto detects it per line (one format per file)")
    p.add_argument("--template_name", default=None,
                   help="which named chat template when the config holds several")
    p.add_argument("--max_errors", type=int, default=20, help="input errors listed before stopping")
    p.add_argument("--max_line_bytes", type=int, default=Limits.max_line_bytes)
    p.add_argument("--max_messages", type=int, default=Limits.max_messages)
    p.add_argument("--input_fds", default=None,
                   help="comma-separated inherited descriptors, one per input in order: the "
                   "inputs are read from them (the names only label errors)")
    p.add_argument("--model_fds", default=None,
                   help="NAME=FD,... inherited descriptors of the model directory's tokenizer "
                   "files: only these are read (a file not listed counts as absent)")
    p.add_argument("inputs", nargs="+", help="JSONL files")
    return p


def _descriptors(text, flag):
    fds = []
    for item in text.split(","):
        if not item.isdigit():
            raise _Usage(f"{flag}: '{item}' is not a descriptor number")
        fd = int(item)
        try:
            os.fstat(fd)
        except OSError as e:
            raise _Usage(f"{flag}: descriptor {fd}: {e.strerror}") from None
        fds.append(fd)
    return fds


def run(argv):
    args = _parser().parse_args(argv)
    if args.max_errors < 1 or args.max_line_bytes < 1 or args.max_messages < 1:
        raise _Usage("--max_errors, --max_line_bytes and --max_messages must be positive")
    input_fds = _descriptors(args.input_fds, "--input_fds") if args.input_fds else None
    if input_fds is not None and len(input_fds) != len(args.inputs):
        raise _Usage(f"--input_fds lists {len(input_fds)} descriptors for {len(args.inputs)} "
                     "inputs")
    model_fds = _held_files(args.model_fds)
    for path in args.inputs:
        if input_fds is None and not os.path.isfile(path):
            raise _Usage(f"{path}: not a regular file")
    model = model_dir.load(args.model, args.template_name, model_fds)
    template = None
    if model.chat_template is not None:
        try:
            template = ChatTemplate(model.chat_template, model.special_tokens)
        except Exception as e:  # jinja2.TemplateSyntaxError
            raise ModelError(f"{args.model}: chat_template does not compile: {e}") from None
    masker = Masker(model, template)
    limits = Limits(args.max_line_bytes, args.max_messages)
    forced = None if args.format == "auto" else args.format

    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise _Usage(f"--out={args.out}: directory {out_dir} does not exist")
    writer = SampleSetWriter(args.out)
    errors = 0
    formats = {name: 0 for name in FORMATS}
    longest = {"tokens": 0, "file": None, "line": None}
    try:
        for i, path in enumerate(args.inputs):
            fd = None if input_fds is None else input_fds[i]
            for item in read_samples(path, forced, limits, fd):
                if isinstance(item, InputError):
                    error = item
                else:
                    try:
                        ids, mask = masker.tokenize(item)
                    except InputError as e:
                        error = e
                    else:
                        if errors == 0:
                            writer.add(ids, mask)
                            formats[item.format] += 1
                            if len(ids) > longest["tokens"]:
                                longest = {"tokens": len(ids), "file": path, "line": item.line}
                        continue
                errors += 1
                print(error, file=sys.stderr)
                if errors >= args.max_errors:
                    print(f"megatrain_chat_tokenize: stopped after {errors} errors",
                          file=sys.stderr)
                    return EXIT_BAD_INPUT
        if errors:
            print(f"megatrain_chat_tokenize: {errors} bad lines; nothing written", file=sys.stderr)
            return EXIT_BAD_INPUT
        if writer.samples == 0:
            print("megatrain_chat_tokenize: the inputs hold no sample", file=sys.stderr)
            return EXIT_BAD_INPUT
        writer.commit()
    finally:
        writer.close()
    summary = {
        "out": args.out,
        "samples": writer.samples,
        "tokens": writer.tokens,
        "counted_tokens": writer.counted,
        "vocab_size": writer.max_id + 1,  # the file's V
        # The tokenizer's, added tokens included: what the model's embedding must cover.
        "tokenizer_vocab_size": model.tokenizer.get_vocab_size(with_added_tokens=True),
        "formats": formats,
        "longest_sample": longest,
        "chat_template": template is not None,
        "format": "mtsft",
        "output_version": OUTPUT_VERSION,
        "tokenizers": tokenizers.__version__,
        "jinja2": jinja2.__version__,
    }
    print(json.dumps(summary, ensure_ascii=False))
    return EXIT_OK


def _held_files(text):
    """--model_fds NAME=FD,...: {name: descriptor}, or None when the flag is absent."""
    if text is None:
        return None
    held = {}
    for item in filter(None, text.split(",")):
        name, _, fd = item.partition("=")
        if not name or "/" in name:
            raise _Usage(f"--model_fds: '{item}' is not NAME=FD")
        held[name] = _descriptors(fd, "--model_fds")[0]
    return held


def _chat_io(argv):
    """--render / --decode and their list forms (hf_chat/chat_io.py): `sample --chat`'s and a
    daemon job's eval prompts' template and decoder."""
    p = _Parser(prog="megatrain_chat_tokenize", description=chat_io.__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="HF model or checkpoint directory")
    p.add_argument("--template_name", default=None)
    p.add_argument("--model_fds", default=None,
                   help="NAME=FD,... inherited descriptors of the directory's files")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--render", help='{"messages": [...]}: rendered for a reply, as ids')
    mode.add_argument("--decode", help="comma-separated token ids to text")
    mode.add_argument("--render_prompts", help='["user message", ...]: each rendered for a reply')
    mode.add_argument("--decode_lists", help="[[ids], ...]: each decoded to text")
    args = p.parse_args(argv)
    held = _held_files(args.model_fds)
    try:
        if args.render is not None:
            chat_io.print_json(chat_io.render(args.model, args.render, args.template_name, held))
        elif args.render_prompts is not None:
            chat_io.print_json(chat_io.render_prompts(args.model, args.render_prompts,
                                                      args.template_name, held))
        elif args.decode_lists is not None:
            chat_io.print_json(chat_io.decode_lists(args.model, args.decode_lists, held))
        else:
            chat_io.print_json(chat_io.decode(args.model, args.decode, held))
    except ValueError as e:  # a bad conversation or id list (jinja2's errors are not these)
        raise _Usage(str(e)) from None
    except jinja2.TemplateError as e:
        raise ModelError(f"{args.model}: the chat template failed: {e}") from None
    return EXIT_OK


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        if any(a.split("=")[0] in ("--render", "--decode", "--render_prompts", "--decode_lists")
               for a in argv):
            return _chat_io(argv)
        return run(argv)
    except _Usage as e:
        print(f"megatrain_chat_tokenize: {e}", file=sys.stderr)
        return EXIT_FAILED
    except ModelError as e:
        print(f"megatrain_chat_tokenize: {e}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as e:
        print(f"megatrain_chat_tokenize: {e}", file=sys.stderr)
        return EXIT_FAILED
