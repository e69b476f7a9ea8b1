"""What the lesson notebooks (notebooks/*.ipynb) need besides the core and the widgets: the
checks of their exercises (`exercises`)."""
