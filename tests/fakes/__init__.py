"""Local stand-ins for remote services (model APIs only), served over real HTTP."""
