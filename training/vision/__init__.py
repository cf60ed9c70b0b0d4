"""Data-parallel ImageNet classification (ResNet50, EfficientNet-B7) with Accelerate DDP."""
