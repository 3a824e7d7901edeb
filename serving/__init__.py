"""What both servers share and no client needs: the gRPC server and its edge, storage
seams (SQLite, PostgreSQL, Redis), configuration, authorisation, metrics, supervision."""
