//! Engine performance model and emulated engines speaking the Ollama, OpenAI and LM Studio APIs.
