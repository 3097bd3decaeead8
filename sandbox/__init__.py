"""Local stand-ins for Horizon, the Anchor Platform, Razorpay/RazorpayX and a SEP-31
receiving anchor, served by ``python manage.py sandbox``. Imports nothing from
Corridor's apps; keeps its state in its own database (``sandbox`` alias)."""
