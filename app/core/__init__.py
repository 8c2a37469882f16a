"""The app's Qt-free core: chat session, view models (all report wording), the conversation
store, markdown rendering. Never imports PySide6 (an import contract checks it)."""
