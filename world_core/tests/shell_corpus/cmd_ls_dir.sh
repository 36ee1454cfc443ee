mkdir -p d
touch d/z d/y
ls d
