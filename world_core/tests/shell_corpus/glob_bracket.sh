touch x1 x2 x3 y1
echo x[12]
