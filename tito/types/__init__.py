"""Value types shared by every layer (design §3): errors, the engine contract, messages,
turn records, the mismatch-report classes and the tokenizer wrapper. This package imports
no other ``tito`` package."""
