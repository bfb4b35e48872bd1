"""Text: the checkpoint's tokenizer, the test vocabularies and the chat template."""
