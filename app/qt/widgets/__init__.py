"""The window's widgets: chat view, composer, sidebar, debug panel, dialogs."""
