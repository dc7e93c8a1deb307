"""``det``: object detection with SSDLite on the reduced backbone."""
