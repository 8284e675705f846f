//! Engine adapters (Ollama, LM Studio, OpenAI-compatible): health, inventory, port inversion.
