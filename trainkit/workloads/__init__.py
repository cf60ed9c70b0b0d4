"""What a backend runs besides the training recipes: the collective sweep (nccl_test.py, `invoke nccl-test`) and
the ImageNet copy and layout (imagenet.py, `invoke data.imagenet`)."""
