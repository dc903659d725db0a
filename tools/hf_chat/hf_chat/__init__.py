"""hf_chat: chat / prompt-completion / Alpaca JSONL -> an MTSFT sample-set file, tokenized with an
HF model directory's own tokenizer and chat template (see docs/fine_tuning.md)."""
