import sys
from pathlib import Path

# tiny_models.py sits beside the tests
sys.path.insert(0, str(Path(__file__).resolve().parent))
