"""The built-in tiny policy and HF-format loading (config.json + safetensors + tokenizer.json)."""
