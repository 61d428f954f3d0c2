"""Server of the Liuguang Studio AI image and video workbench."""

__version__ = "0.1.0"
