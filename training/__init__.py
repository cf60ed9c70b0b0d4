"""What runs inside a training job, on a laptop or a p5. Never imports trainkit."""
