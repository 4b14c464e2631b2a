"""The Gemini API (`generateContent`, `streamGenerateContent`, `countTokens`, `models`): its paths
and key, request translation, tools and the schema dialect, and the wire (answers, both stream
forms, Gemini-shaped errors)."""
