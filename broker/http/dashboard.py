"""placeholder"""
from aiohttp import web
routes = web.RouteTableDef()
def setup(app):
    pass
