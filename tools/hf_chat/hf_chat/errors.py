"""The tool's error types: bad input (a line of a JSONL file) vs a bad model directory / usage."""


class InputError(Exception):
    """A JSONL line that cannot become a sample; str() is "FILE:LINE: field F: what (value)"."""

    def __init__(self, path, line, field, message):
        self.path, self.line, self.field = path, line, field
        where = f"{path}:{line}" if line else str(path)
        text = f"{where}: field {field}: {message}" if field else f"{where}: {message}"
        super().__init__(text)


class ModelError(Exception):
    """The model directory (tokenizer.json, tokenizer_config.json, template) cannot be used."""
