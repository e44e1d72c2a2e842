"""S3 operation handlers: ``async def op(ctx, req) -> Response`` each."""
