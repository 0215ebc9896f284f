"""Reports: paper tables beside ours, rooflines, scaling, accuracy and the regression dashboard, read from the store."""
