"""FlatBuffers builder functions of the tokenizer schema (generated; see image/tokenizer/schema.py)."""
