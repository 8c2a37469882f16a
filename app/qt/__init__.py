"""The Qt side of the app: main, the window, background work, theme, and widgets/."""
